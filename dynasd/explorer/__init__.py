"""The explorer: what the page does with the engine, as data and plain functions, with no Gradio in it.

Its hall (the modules here) is what every room uses: what a user can send and how it is checked (inputs), the model
pairs a process loads once (pairs), the model work as functions of data that cross a GPU process's boundary
(engine), a model call's failure as data (failures) and a token as a learner reads it (labels). Four rooms stand
on it, and imports only go down (tests/test_layout.py):
- costs: what a step costs on this device (the kept calibration, bigger targets' shapes), the best static trees.
- measure (on costs): how fast a method is here; Compare and its peer, the speed figures' one owner, Where would it
  pay?, Rows and batches.
- lessons: arithmetic on a recorded run for the learner's own acts: predictions, the guided phases, the quiz, the
  misconception lab, the KV ledger, the losslessness check and two methods side by side. No lesson needs a cost or
  a measure.
- sessions (on top): a session's life as one state machine, its registry, the calls a step makes to the model,
  share links and the server's memory.
"""
