"""The decode loop: the orchestrator that drives drafter and verifier rounds, the gamma
controller and the tokenizer. Pricing a run on real boards lives in host/projection/."""
