"""How fast each method is here, from the costs below (explorer.costs): Compare and its peer (compare, peer), the
last Compare kept on this machine (measured_here), a run's speed figures in one place (speed), verify cost by rows
and batch (batching) and Where would it pay? (where). Measurements use the hall and the costs, never a lesson or a
session."""
