"""Projection onto real boards: hardware figures, the cost model, calibration, the board bench,
and the replay of a run's rounds (one board per role, or a pipeline of stages) in virtual time."""
