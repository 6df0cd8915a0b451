"""What a step costs on this device, below every speed figure: the verify calibration and the draft's forwards,
kept per device and pair (cost), measured in parts (measuring), bigger targets' shapes measured here (targets), the
best static tree per node budget from a run's acceptance (trees_by_budget) and the two shipped examples' reasons
(both_sides). Costs use the hall
(the engine, the pairs) and dynasd's step-cost formulas, never a lesson, a speed figure or a session."""
