"""Speed as arithmetic: what a step costs and the speed-up that follows (step_cost.py), the search over static tree
shapes (tree_search.py) and the `dynasd best-tree` command that measures its choice (best_tree.py)."""
