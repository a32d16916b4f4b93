"""specmesh tools: drafter distillation, export, llama2.c import, model card, test vectors, benchmarks, fuzzing."""
