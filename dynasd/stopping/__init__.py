"""Stopping a draft early: the early-stop policies of dynamic depth (policies.py) and the decision models some of
them read (decision_models.py)."""
