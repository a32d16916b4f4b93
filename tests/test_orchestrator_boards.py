"""The decode loop with virtual boards (real MicroPython VMs flashed with the node, host/provision/cluster.py):
greedy speculative output equals plain output and the CPU verifier's; sampling is reproducible;
ESP-NOW through a gateway with 5% loss and 1% duplication gives the serial transport's text."""

import random
from pathlib import Path

import pytest

from specmesh.host.backends import LocalDrafter, LocalVerifier, SessionParams
from specmesh.host.decode.gamma import GammaController
from specmesh.host.decode.orchestrator import generate
from specmesh.host.layout import DRAFTER_FILE, TARGET_FILE
from specmesh.host.provision.cluster import Cluster
from specmesh.tools.testmodels import random_pair

VOCAB = 64
ROOT = Path(__file__).resolve().parent.parent
HELD_OUT = ["Once upon a time", "The dog ran", "She said that", "In the box there was", "He wanted to",
            "The sun", "A little bird", "They went to the", "It was a cold", "Mom and Dad",
            "The king", "One day, a", "Tom had a big", "The cat sat on", "We can", "Lily found a",
            "At night the", "The old man", "If you", "Her friend"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    random_pair(d, vocab=VOCAB, max_seq=96, seed=31)
    return d


@pytest.fixture(scope="module")
def serial_boards(models, tmp_path_factory):
    with Cluster("serial", models, tmp_path_factory.mktemp("vboards")) as c:
        yield c.backend("verifier"), c.backend("drafter")


def prompts(n, seed=3):
    rng = random.Random(seed)
    return [[rng.randrange(VOCAB) for _ in range(rng.randrange(1, 7))] for _ in range(n)]


def check_greedy(verifier, drafter, cpu_verifier, n_prompts, max_tokens=16):
    params = SessionParams(temperature=0.0)
    accepted = 0
    for i, prompt in enumerate(prompts(n_prompts)):
        plain = generate(prompt, verifier, None, params, max_tokens).tokens
        spec = generate(prompt, verifier, drafter, params, max_tokens, GammaController(fixed=1 + i % 5))
        assert spec.tokens == plain, "prompt %d" % i
        # the numpy engine follows the firmware's arithmetic bit for bit: the CPU verifier agrees
        assert generate(prompt, cpu_verifier, None, params, max_tokens).tokens == plain, "prompt %d" % i
        accepted += spec.accepted
    assert accepted > 0


def test_greedy_virtual_boards_equal_plain_and_the_cpu_verifier_for_20_prompts(serial_boards, models):
    check_greedy(*serial_boards, LocalVerifier(models / TARGET_FILE), 20)


@pytest.mark.slow
def test_greedy_virtual_boards_with_the_shipped_models(tmp_path):
    from specmesh.host.decode.tokenizer import Tokenizer

    models = ROOT / "models"
    tok = Tokenizer.from_llama2c(models / "tokenizer.bin")
    params = SessionParams(temperature=0.0, eos=0)
    cpu = LocalVerifier(models / TARGET_FILE)
    with Cluster("serial", models, tmp_path) as c:
        verifier, drafter = c.backend("verifier"), c.backend("drafter")
        for i, text in enumerate(HELD_OUT):
            prompt = tok.encode(text)
            plain = generate(prompt, verifier, None, params, 32).tokens
            spec = generate(prompt, verifier, drafter, params, 32, GammaController(fixed=1 + i % 6)).tokens
            assert spec == plain, text
            assert generate(prompt, cpu, None, params, 32).tokens == plain, text  # same arithmetic


def test_sampling_same_seed_same_text_across_drafter_and_verifier_kinds(serial_boards, models):
    verifier, drafter = serial_boards
    params = SessionParams(seed=77, temperature=0.9, draft_top_k=6)
    board = [generate([4, 5], verifier, drafter, params, 16, GammaController(fixed=3)).tokens for _ in range(2)]
    assert board[0] == board[1]
    # the host CPU drafter samples exactly as the firmware drafter (q-hat, PRNG purpose DRAFT), and the
    # board verifier as the CPU one: every mix gives the same text for the same seed
    cpu_d, cpu_v = LocalDrafter(models / DRAFTER_FILE), LocalVerifier(models / TARGET_FILE)
    assert generate([4, 5], verifier, cpu_d, params, 16, GammaController(fixed=3)).tokens == board[0]
    assert generate([4, 5], cpu_v, drafter, params, 16, GammaController(fixed=3)).tokens == board[0]


def test_parameters_between_wire_steps_give_one_text_on_boards_and_the_cpu(serial_boards, models):
    """The host snaps temperature and top_p to BEGIN's thousandths and Q16 once; the CPU verifier then
    samples with the floats a board makes of the wire values (it used 1.2345 where boards used round(1234.5) = 1.234)."""
    verifier, drafter = serial_boards
    params = SessionParams(seed=21, temperature=1.2345, top_p=0.95, target_top_k=30, draft_top_k=6)
    assert (params.temp_milli, params.temperature, params.top_p_q16, params.top_p) == (1235, 1.235, 62259,
                                                                                        62259 / 65536)
    board = generate([3, 9], verifier, drafter, params, 24, GammaController(fixed=2)).tokens
    cpu_v = LocalVerifier(models / TARGET_FILE)
    assert generate([3, 9], cpu_v, drafter, params, 24, GammaController(fixed=2)).tokens == board
    with pytest.raises(ValueError, match="rounds to 0"):  # greedy on a board, sampled on the host: refused
        SessionParams(temperature=0.0004)


def test_espnow_with_loss_and_duplication_gives_the_serial_text(serial_boards, models, tmp_path):
    from specmesh.host.emulator.radio import RadioConfig

    verifier, drafter = serial_boards
    radio = RadioConfig(loss=0.05, duplicate=0.01, seed=1)
    cases = [(SessionParams(temperature=0.0), [9, 1]), (SessionParams(seed=5, temperature=0.8), [2, 7, 3])]
    want = [generate(p, verifier, drafter, params, 20, GammaController(fixed=3)).tokens for params, p in cases]
    with Cluster("espnow", models, tmp_path, radio=radio) as c:
        v, d = c.backend("verifier"), c.backend("drafter")
        got = [generate(p, v, d, params, 20, GammaController(fixed=3)).tokens for params, p in cases]
        assert got == want
        assert c.hub.stats.lost > 0  # the radio did lose packets; link retries and retransmission recovered them


@pytest.mark.hil
def test_real_boards_greedy_equals_plain():
    """SPECMESH_PORTS=DRAFTER_PORT,VERIFIER_PORT: boards flashed with `specmesh flash --role ...`."""
    import os

    from specmesh.host.provision.cluster import connect

    ports = os.environ.get("SPECMESH_PORTS", "").split(",")
    if len(ports) != 2 or not all(ports):
        pytest.skip("set SPECMESH_PORTS=DRAFTER_PORT,VERIFIER_PORT")
    with connect(ports[0], "drafter") as drafter, connect(ports[1], "verifier") as verifier:
        params = SessionParams(temperature=0.0, eos=0)
        for i, prompt in enumerate(prompts(3)):
            plain = generate(prompt, verifier, None, params, 16).tokens
            assert generate(prompt, verifier, drafter, params, 16, GammaController(fixed=2 + i)).tokens == plain


def test_a_refused_begin_is_reported_at_the_next_call_and_the_board_stays_usable(serial_boards):
    from specmesh.host.backends import BackendError

    verifier, drafter = serial_boards
    drafter.begin(SessionParams(), [VOCAB + 5])  # returns at once: the node answers while the host goes on
    with pytest.raises(BackendError, match="outside the vocabulary") as e:
        drafter.draft([VOCAB + 5], 2)
    assert "\n" not in str(e.value) and drafter.resyncs == 0
    params = SessionParams(temperature=0.0)
    plain = generate([5, 6], verifier, None, params, 8).tokens
    assert generate([5, 6], verifier, drafter, params, 8, GammaController(fixed=2)).tokens == plain


def test_pipelined_drafting_changes_nothing_but_time(serial_boards, models, tmp_path):
    verifier, drafter = serial_boards
    cases = [(SessionParams(temperature=0.0), [8, 8]), (SessionParams(seed=9, temperature=0.9), [1, 30, 2])]
    want = [generate(p, verifier, drafter, params, 24, GammaController(fixed=2)).tokens for params, p in cases]
    with Cluster("serial", models, tmp_path, spec_ahead=6) as c:
        ahead = c.backend("drafter")
        for _ in range(3):  # until the drafter did draft ahead while verdicts were pending: a drafter VM the host's
            # other processes starve of the cores (a loaded CI machine) may get no idle moment in one pair of runs
            got = [generate(p, verifier, ahead, params, 24, GammaController(fixed=2)).tokens for params, p in cases]
            assert got == want
            if ahead.stats()["ahead"] > 0:
                break
        assert ahead.stats()["ahead"] > 0


@pytest.mark.parametrize("console_seen", [True, False])
def test_a_board_whose_model_fails_to_load_is_reported_with_the_cause(models, tmp_path, monkeypatch, console_seen):
    """A model corrupted on the board's flash: the node comes up idle and says why on its console; the host
    names that cause and how to reflash the port, rather than calling the board 'not flashed'. A console line
    the host missed (printed at boot, before the port opened) is asked of the node instead."""
    from emulator_util import mpremote
    from specmesh.host.backends import BackendError
    from specmesh.host.bus.links import SerialLink
    from specmesh.host.provision.cluster import connect

    if not console_seen:
        monkeypatch.setattr(SerialLink, "_on_text", lambda self, line: None)

    with Cluster("serial", models, tmp_path) as c:
        vb = c.start("verifier")
        model = vb.flash_dir / "models" / TARGET_FILE
        data = bytearray(model.read_bytes())
        data[300] ^= 0xFF
        model.write_bytes(bytes(data))
        assert mpremote(vb.port, "reset").returncode == 0
        with pytest.raises(BackendError) as e:
            with connect(vb.port, "verifier"):
                pass
    msg = str(e.value)
    assert "did not start as a verifier" in msg and "CRC" in msg and "\n" not in msg
    assert "`specmesh flash --port %s --role verifier`" % vb.port in msg


def test_booting_and_flashing_say_what_they_do_and_skip_an_up_to_date_board(models, tmp_path):
    said = []
    for _ in range(2):
        lines = []
        with Cluster("serial", models, tmp_path, say=lines.append) as c:
            c.start("drafter")
        said.append(lines)
    from specmesh.host.provision.flash import node_sources

    files = len(list(node_sources())) + 3  # the node's files, its native kernels, the model and the board config
    first, again = said
    assert first[0] == "virtual drafter board (esp32): booting, flashing the node and drafter.spm with mpremote..."
    assert first[1].startswith("virtual drafter board (esp32): flashed %d files (" % files)
    assert again[1].startswith("virtual drafter board (esp32): up to date, not flashed (%d files checked in " % files)


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_projected_bus_bytes_are_the_measured_ones_round_by_round(serial_boards, models, temperature):
    """host/projection/rounds.py's byte model against the bytes the host's links carried, per round and per link
    (the first round also collects BEGIN's ACK, so it is left out); a plain round is 22 bytes. A run during which
    a link resent a frame (its reply came after the retransmission timeout: the VMs share the test workers'
    cores) carried bytes no model of the protocol prices, so it is not compared; the others are (one at least)."""
    from specmesh.host.projection.rounds import Projector
    from specmesh.shared.modelfile import parse_header

    verifier, drafter = serial_boards
    heads = [parse_header((models / f).read_bytes()[:64]) for f in (TARGET_FILE, DRAFTER_FILE)]
    proj = Projector(heads[0], heads[1], "esp32s3", "serial")
    params = SessionParams(seed=5, temperature=temperature, draft_top_k=8)

    def unresent(*args):
        """generate(*args), and whether no frame was resent meanwhile."""
        before = verifier.proxy.bus.retransmits + drafter.proxy.bus.retransmits
        run = generate(*args)
        return run, verifier.proxy.bus.retransmits + drafter.proxy.bus.retransmits == before

    compared = 0
    for prompt in prompts(4, seed=7):
        plain, clean = unresent(prompt, verifier, None, params, 12)
        assert not clean or {r.bytes_verify for r in plain.rounds[1:]} == {22}
        spec, spec_clean = unresent(prompt, verifier, drafter, params, 20, GammaController(fixed=3))
        auto, auto_clean = unresent(prompt, verifier, drafter, params, 20)  # gamma auto: greedy plain rounds shadow
        ahead = GammaController(fixed=3)
        ahead.pipelined = True  # drafting beside each verify: ready rounds send no DRAFT_REQ
        pipe, pipe_clean = unresent(prompt, verifier, drafter, params, 20, ahead)
        assert pipe.tokens == spec.tokens and any(r.ahead for r in pipe.rounds)
        runs = [(spec, spec_clean), (pipe, pipe_clean)] + ([(auto, auto_clean)] if temperature == 0.0 else [])
        for run in (run for run, clean in runs if clean):
            compared += 1
            drafted = run.rounds[0].gamma > 0 or run.rounds[0].shadow
            for r in run.rounds[1:]:
                assert proj.round_bytes(r, drafted) == {"drafter": r.bytes_draft, "verifier": r.bytes_verify}
                drafted = drafted or r.gamma > 0 or r.shadow
        assert (auto.shadows > 0) == (temperature == 0.0)
        if temperature:
            assert any(r.table_body for r in spec.rounds)  # a rejection sent its whole q-hat table
    assert compared > 0
