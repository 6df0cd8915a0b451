"""What a step costs on this device and how fast each method is here: the calibration and the kept costs (cost),
bigger targets' shapes (targets), Where would it pay? (where), a run's speed figures in one place (speed), verify
cost by rows and batch (batching), the best static tree per budget (best_trees), Compare and its peer (compare,
peer) and the last Compare kept on this machine (measured_here). Measurements use the hall (the engine, the pairs),
never a lesson or a session."""
