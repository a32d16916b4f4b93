"""The run's configuration (host/cli/config.py): built once from `specmesh run`'s arguments, frozen, the
arguments left as they were; the back-ends it names come from the one registry (host/cli/registry.py)."""

import argparse
import dataclasses

import pytest

from specmesh.host import backends
from specmesh.host.boardclasses import BOARD_CLASSES, ESP32, ESP32S3, has_psram
from specmesh.host.cli.config import RunConfig
from specmesh.host.cli.run import add_arguments, check_args


def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(list(argv))


def test_the_arguments_become_a_frozen_config_and_stay_as_they_were(models):
    a = parse("--models", str(models), "--gamma", "3", "--temperature", "0.5", "--no-color")
    before = dict(vars(a))
    config = check_args(a)
    assert vars(a) == before  # nothing added (rates, key) or changed
    assert isinstance(config, RunConfig) and config.gamma == 3 and config.color is False and config.key is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.gamma = 4
    assert config.session_params(eos=1).temperature == 0.5


def test_stages_verify_on_the_registered_pipeline_and_plain_drops_the_drafter(models):
    assert check_args(parse("--models", str(models), "--stages", "2")).backend_names == {
        "verifier": backends.PIPELINE, "drafter": "virtual"}
    assert check_args(parse("--models", str(models), "--plain", "--verifier", "cpu")).backend_names == {
        "verifier": "cpu"}


def test_every_board_class_is_a_virtual_backend_of_both_roles_and_the_pipeline_a_verifier():
    from specmesh.host.cli import registry

    for name in BOARD_CLASSES:
        assert registry.factory("verifier", "virtual:" + name) is registry.VERIFIERS["virtual:" + name]
        assert registry.factory("drafter", "virtual:" + name) is registry.DRAFTERS["virtual:" + name]
    assert registry.factory("verifier", backends.PIPELINE) is not None
    assert registry.factory("drafter", backends.PIPELINE) is None


def test_psram_is_told_from_the_heap_the_board_classes_hold():
    assert not has_psram(ESP32.heap_bytes) and has_psram(ESP32S3.heap_bytes)
    assert not has_psram(187_104)  # a virtual classic ESP32 after boot: its heap also holds the stand-ins
    assert has_psram(2 * 1024 * 1024)  # a board with 2 MB of PSRAM


def test_gamma_auto_starts_from_the_model_cards_acceptance_of_the_drafter_that_runs(models):
    from types import SimpleNamespace

    from specmesh.host.cli.session import gamma_controller
    from specmesh.host.provision.drafters import HEAP, WIDE

    board = SimpleNamespace(info={"model": "/models/%s" % HEAP.file})  # a drafter board's HELLO names its file
    assert gamma_controller(check_args(parse("--models", str(models))), board).alpha == pytest.approx(
        HEAP.alpha_greedy)
    cpu = SimpleNamespace()  # the host's drafter runs the file the run names
    assert gamma_controller(check_args(parse("--models", str(models), "--drafter", "cpu")), cpu).alpha == (
        pytest.approx(WIDE.alpha_greedy))
    sampled = check_args(parse("--models", str(models), "--drafter", "cpu", "--temperature", "1"))
    assert gamma_controller(sampled, cpu).alpha == pytest.approx(WIDE.alpha_sampled)
    other = SimpleNamespace(info={"model": "/models/mine.spm"})  # not on the card: no prior
    assert gamma_controller(check_args(parse("--models", str(models))), other).alpha == 0.5
    fixed = gamma_controller(check_args(parse("--models", str(models), "--gamma", "3")), board)
    assert fixed.fixed == 3 and fixed.alpha == 0.5
