"""The back-ends a `specmesh run` offers, put into the one registry (host/backends/__init__.py) by importing
the modules that define them: `cpu` (host/backends), the boards (`virtual`, `virtual:CLASS`, `pipeline`, serial
ports: host/provision/cluster.py) and the torch verifiers (host/backends/torch_backend.py). The torch module
is imported on first use (PyTorch takes seconds to import, and `--verifier cpu` never needs it); until then
its names stand in the registry as factories that import it."""

from __future__ import annotations

import specmesh.host.provision.cluster  # noqa: F401 - registers the board back-ends
from specmesh.host.backends import VERIFIERS, register_verifier

TORCH_VERIFIERS = ("torch-cpu", "gpu")


def _torch(name: str):
    def make(model_path, **options):
        import specmesh.host.backends.torch_backend  # noqa: F401 - registers the real factory under `name`

        return VERIFIERS[name](model_path, **options)

    return make


for _name in TORCH_VERIFIERS:
    if _name not in VERIFIERS:  # already imported: its own factory stays
        register_verifier(_name, _torch(_name))
