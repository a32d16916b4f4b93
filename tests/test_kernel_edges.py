"""The viper and native kernels at the edges of their shift counts (tests/mp_kernel_edges.py), under the
unix port: rounding shifts of 46 and more give 0 and left shifts of 32 and more give the exact value modulo
2^32, as the reference kernels do. 32-bit cores shift by a count's low 5 bits and x64 by its low 6, so the
unix port sees the counts of 64 and more; tests/test_xtensa_native_module.py runs the same script on an
Xtensa core, which sees those from 32."""

import subprocess

from tests.conftest import ROOT


def test_viper_and_native_kernels_agree_with_the_reference_at_every_shift_edge(micropython):
    out = subprocess.run([micropython, "tests/mp_kernel_edges.py"], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["viper ok", "native ok"], out.stdout
