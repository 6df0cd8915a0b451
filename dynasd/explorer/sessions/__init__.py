"""A session's life, on top of the other rooms: its state as data (session), one method per learner action
(controller), sessions by id (registry), share links and example traces (share) and the server's memory (memory)."""
