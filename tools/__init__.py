"""specmesh tools: corpus, tokenizer, training, export, llama2.c import, test vectors, benchmarks."""
