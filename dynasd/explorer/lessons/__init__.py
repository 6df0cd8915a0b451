"""The learner's own acts, each arithmetic on a recorded run so replayed and example traces work: predict then
reveal (predict), a step phase by phase (phases), the checkpoint quiz (quiz), the misconception lab
(misconceptions), the KV-cache ledger (ledger), and two checks that run the model through the hall's engine: the
first token's sampled distribution (losslessness) and two methods taking one step (side_by_side)."""
