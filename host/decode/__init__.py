"""The decode loop: the orchestrator that drives drafter and verifier rounds, the gamma
controller, the tokenizer, and the projection of a run onto real boards (hardware figures,
cost model, calibration)."""
