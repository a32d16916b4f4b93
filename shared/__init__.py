"""specmesh shared: codec, acceptance rule, PRNG and model-file header, for boards and host alike."""
