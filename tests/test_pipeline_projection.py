"""The pipeline projection (host/projection/pipeline.py): the wavefront's discrete-event model, the stage
costs it is built from (Projector.forward over a layer slice), and the stats it reports."""

import pytest

from specmesh.host.backends import LocalDrafter, LocalVerifier, SessionParams
from specmesh.host.decode.gamma import GammaController
from specmesh.host.layout import DRAFTER_FILE, TARGET_FILE
from specmesh.host.projection.costmodel import weight_bytes
from specmesh.host.projection.hardware import (CYCLES_PER_INSN, FLASH_MAP_STREAM, HOST_DRAFT_POSITION, PACKED_ROW_BYTES,
                                               ROW_CODEC, UART_921600)
from specmesh.host.decode.orchestrator import Round, generate
from specmesh.host.projection.pipeline import PipelineProjector, judged
from specmesh.host.projection.rounds import Projector, draft_entries, stage_body, stage_reply_body
from specmesh.host.decode.tokenizer import Tokenizer
from specmesh.host.provision.cluster import split_layers
from specmesh.shared.modelfile import HEADER_SIZE, parse_header
from tests.conftest import ROOT

MODELS = ROOT / "models"


@pytest.fixture(scope="module")
def heads():
    return [parse_header((MODELS / f).read_bytes()[:HEADER_SIZE]) for f in (TARGET_FILE, DRAFTER_FILE)]


def test_stage_costs_add_up_to_the_whole_model(heads):
    target = heads[0]
    p = Projector(target, None, "esp32")  # no PSRAM term: stages hold their layers in the heap
    whole = sum(t for name, t in p.terms(target, 3, 40).items() if name != "weights_flash")
    for n in (1, 2, 5):
        layers = split_layers(5, n)
        parts = sum(p.forward(target, 3, 40, ab, classifier=ab[1] == 5) for ab in layers)
        assert parts == pytest.approx(whole)
    assert p.forward(target, 1, 40, (0, 1), classifier=False) < p.forward(target, 1, 40, (4, 5), classifier=True)


def test_a_whole_model_on_a_board_without_psram_reads_its_weights_from_romfs(heads):
    target, drafter = heads
    p = Projector(target, drafter, "esp32")
    terms = p.terms(drafter, 1, 50)
    assert terms["weights_flash"] == pytest.approx(weight_bytes(drafter) / FLASH_MAP_STREAM.value)
    assert "kv_psram" not in terms and "weights_psram" not in terms  # its KV cache is in the heap
    assert "weights_flash" not in p.terms(target, 1, 50, (0, 1), classifier=False)  # a stage's slice: heap
    assert "weights_flash" not in Projector(target, drafter, "esp32s3").terms(drafter, 1, 50)  # PSRAM board


@pytest.mark.parametrize("packed", [True, False])
def test_one_position_costs_request_compute_and_reply_at_every_stage(heads, packed):
    pp = PipelineProjector(heads[0], heads[1], split_layers(5, 5), UART_921600.name, packed=packed)
    t = pp.wavefront(10, 1, 0, 0, [])
    row = round(PACKED_ROW_BYTES[1]) if packed else 4 * heads[0].dim
    want = sum(pp._wire(stage_body(0, 2 if s == 0 else row)) + pp._stage(s, 11, True)
               + pp._wire(stage_reply_body(2 if s == 4 else row))
               for s in range(5))
    assert t == pytest.approx(want)


def test_packed_rows_cost_their_measured_bytes_and_the_boards_codec(heads):
    """Packed rows (193 measured bytes instead of 256) shorten every relayed line; each stage pays its viper
    codec (ROW_CODEC) on the rows it unpacks and packs, far less than the bytes it saves on UART."""
    layers = split_layers(5, 5)
    packed = PipelineProjector(heads[0], heads[1], layers, UART_921600.name)
    raw = PipelineProjector(heads[0], heads[1], layers, UART_921600.name, packed=False)
    assert packed.row(2) == 193 < raw.row(2) == 4 * heads[0].dim
    codec = heads[0].dim * ROW_CODEC.value * CYCLES_PER_INSN / 240e6
    assert packed._stage(2, 40, False) == pytest.approx(raw._stage(2, 40, False) + 2 * codec)
    assert packed._stage(0, 40, False) == pytest.approx(raw._stage(0, 40, False) + codec)  # tokens in, a row out
    assert packed._stage(4, 40, True) == pytest.approx(raw._stage(4, 40, True) + codec)  # a row in, a token out
    saved = raw._wire(stage_body(0, raw.row(2))) - packed._wire(stage_body(0, packed.row(2)))
    assert saved > 20 * codec
    assert packed.wavefront(40, 5, 0, 4, [2] * 4) < raw.wavefront(40, 5, 0, 4, [2] * 4)


def test_the_wavefront_overlaps_positions_across_stages_and_stops_at_the_verdict(heads):
    # viper stages: compute-bound, so the overlap shows in the ratio (with native kernels the last stage's
    # classifier read from flash, once per judged position, is most of every stage's time)
    one = PipelineProjector(heads[0], heads[1], split_layers(5, 1), UART_921600.name, kernels="viper")
    five = PipelineProjector(heads[0], heads[1], split_layers(5, 5), UART_921600.name, kernels="viper")
    for pp, overlap in ((one, False), (five, True)):
        single = pp.wavefront(20, 1, 0, 0, [])
        full = pp.wavefront(20, 5, 0, 4, [8] * 4)
        if overlap:
            assert full < 2.5 * single  # 5 positions through 5 stages: far less than 5 passes
        else:
            assert full > 4.5 * single  # one stage: each position waits for the one before
        assert pp.wavefront(20, 5, 0, 0, [8] * 4) < full  # rejected at the first draft: later ones cut


def test_judged_positions_follow_the_verdict():
    def rnd(gamma, acc, rejected):
        return Round(gamma=gamma, n_accepted=acc, n_committed=acc + 1, pos0=10, draft_body=3 + 8 * gamma,
                     verify_body=2 + 4 * gamma, rejected=rejected)

    assert judged(rnd(4, 1, True)) == 2 and judged(rnd(4, 4, False)) == 5
    assert judged(rnd(4, 2, False)) == 2  # an accepted end-of-stream draft: no token judged after it
    assert judged(rnd(0, 0, False)) == 1


def test_a_shipped_pair_run_projects_pipeline_plain_single_board_and_speculative(heads):
    tok = Tokenizer.from_llama2c(MODELS / "tokenizer.bin")
    prompt = tok.encode("Once upon a time")
    r = generate(prompt, LocalVerifier(MODELS / TARGET_FILE), LocalDrafter(MODELS / DRAFTER_FILE),
                 SessionParams(), 32, GammaController(fixed=3))
    for link in ("espnow", UART_921600.name):
        p = PipelineProjector(heads[0], heads[1], split_layers(5, 5), link).project(r, len(prompt))
        n = sum(x.n_committed for x in r.rounds)
        assert p["tokens_per_s"] == pytest.approx(n / p["wall_s"])
        assert p["speedup_vs_pipeline_plain"] == pytest.approx(p["tokens_per_s"] / p["pipeline_plain_tokens_per_s"])
        assert p["speedup_vs_single_board_plain"] == pytest.approx(
            p["tokens_per_s"] / p["single_board_plain_tokens_per_s"])
        # the single board holds the whole target: the same plain tokens as the esp32s3 Projector
        assert p["single_board_plain_tokens_per_s"] == pytest.approx(
            n / sum(Projector(heads[0], None, "esp32s3").plain_round(len(prompt) + i) for i in range(n)))



def test_a_host_drafter_costs_its_positions_on_the_host_and_no_bus(heads):
    tok = Tokenizer.from_llama2c(MODELS / "tokenizer.bin")
    prompt = tok.encode("Once upon a time")
    r = generate(prompt, LocalVerifier(MODELS / TARGET_FILE), LocalDrafter(MODELS / DRAFTER_FILE),
                 SessionParams(), 32, GammaController(fixed=4))
    layers = split_layers(5, 5)
    for link in ("espnow", UART_921600.name):
        board = PipelineProjector(heads[0], heads[1], layers, link)
        host = PipelineProjector(heads[0], heads[1], layers, link, drafter_on_host=True)
        for x in r.rounds:
            assert host.draft_seconds(x) == pytest.approx((x.lag + x.gamma) * HOST_DRAFT_POSITION.value)
            if x.gamma:
                assert host.draft_seconds(x) < board.draft_seconds(x)
        b, h = board.project(r, len(prompt)), host.project(r, len(prompt))
        assert h["pipeline_plain_tokens_per_s"] == pytest.approx(b["pipeline_plain_tokens_per_s"])
        assert h["speedup_vs_pipeline_plain"] > b["speedup_vs_pipeline_plain"]

def test_stats_json_of_a_pipeline_run_has_both_speedups_per_link_and_the_trace(heads):
    """build_stats with a pipeline verifier (its stage boards stubbed): the keys scripts read."""
    import argparse

    from specmesh.host.backends.pipeline import PipelineVerifier, RoundTrace
    from specmesh.host.cli.output import format_table
    from specmesh.host.cli.session import build_stats
    from specmesh.host.projection.pipeline import LinksReport

    class Stage:
        name, max_seq, bus_bytes = "stub", 128, 0

        def stats(self):
            return {"compute_s": 0.5, "heap_free": 20_000, "positions": 7, "passes": 7, "cls_reads": 4,
                    "classifier": "streamed from flash"}

    tok = Tokenizer.from_llama2c(MODELS / "tokenizer.bin")
    prompt = tok.encode("Once upon a time")
    r = generate(prompt, LocalVerifier(MODELS / TARGET_FILE), LocalDrafter(MODELS / DRAFTER_FILE),
                 SessionParams(), 16, GammaController(fixed=3))
    layers = split_layers(5, 5)
    pipe = PipelineVerifier([Stage() for _ in layers], layers)
    pipe.trace.append(RoundTrace(7, 4, [7] * 5, [100] * 5, [7] * 5))
    a = argparse.Namespace(seed=0)
    stats = build_stats(a, SessionParams(), r, "x", pipe, None, GammaController(fixed=3), len(prompt),
                        LinksReport(heads[0], heads[1], layers))
    p = stats["projection"]
    assert set(p["links"]) == {"espnow", "uart-921600", "uart-921600+espnow-direct"}
    assert p["hardware"] == p["links"]["uart-921600"]["hardware"]
    for v in p["links"].values():
        assert v["speedup_vs_pipeline_plain"] > 0 and v["speedup_vs_single_board_plain"] > 0
    assert stats["pipeline"]["positions"] == [7] * 5 and stats["pipeline"]["layers"][4] == "4:5"
    assert [b["positions"] for b in stats["boards"]] == [7] * 5
    assert stats["boards"][4]["classifier"] == "streamed from flash" and stats["boards"][4]["cls_reads"] == 4
    table = format_table(stats)
    assert table.count("vs plain on the pipeline") == 3
    assert max(len(line) for line in table.splitlines()) <= 100  # the hardware names wrap, every figure stays
    assert "%s" % round(p["links"]["espnow"]["tokens_per_s"], 1) in table.replace("\n", " ")


def test_stages_of_the_projected_class_on_its_own_link(heads):
    """--project esp32s3: S3 stages on USB-Serial-JTAG, their last stage holding the classifier in its heap;
    the class rule's classic ESP32s stream it from flash every judged position."""
    from specmesh.host.boardclasses import BOARD_CLASSES, classifier_bytes, stage_keeps_classifier
    from specmesh.host.projection.hardware import FLASH_FILE_READ, USB_SERIAL_JTAG

    target, drafter = heads
    layers = split_layers(5, 5)
    s3 = PipelineProjector(target, drafter, layers, USB_SERIAL_JTAG.name, board="esp32s3")
    esp32 = PipelineProjector(target, drafter, layers, UART_921600.name)
    # (no drafting ahead beside a wavefront: a fresh block hides behind the first position's relay)
    assert s3.hops == (USB_SERIAL_JTAG,) and not s3.pipelined and s3.board.name == "esp32s3"
    assert stage_keeps_classifier(target, BOARD_CLASSES["esp32s3"], (4, 5))
    assert not stage_keeps_classifier(target, BOARD_CLASSES["esp32"], (4, 5))
    assert not stage_keeps_classifier(target, BOARD_CLASSES["esp32s3"], (3, 4))  # not the last stage
    assert s3.cls_read == 0.0 and esp32.cls_read == pytest.approx(classifier_bytes(target) / FLASH_FILE_READ.value)
    assert s3._stage(4, 40, True) == pytest.approx(s3.boards.forward(target, 1, 40, (4, 5), classifier=True)
                                                   + s3.codec)  # its input row unpacked
    assert esp32._stage(4, 40, True) - esp32._stage(4, 40, False) > esp32.cls_read
    assert "5 esp32s3 stages" in s3.label() and "usb-serial-jtag" in s3.label() and "in RAM" in s3.label()
    assert "5 esp32 stages" in esp32.label() and "streamed from flash" in esp32.label()
    with pytest.raises(ValueError, match="no link"):
        PipelineProjector(target, drafter, layers, UART_921600.name, board="esp32s3")


def test_the_projection_prices_decoding_and_the_prefill_apart(heads):
    """The single board's projection leaves its prefill out, so the pipeline's tokens/s do too: the first
    round is priced as any other, the prompt's other positions as `prefill_s`."""
    tok = Tokenizer.from_llama2c(MODELS / "tokenizer.bin")
    prompt = tok.encode("Once upon a time there was")
    r = generate(prompt, LocalVerifier(MODELS / TARGET_FILE), LocalDrafter(MODELS / DRAFTER_FILE),
                 SessionParams(), 24, GammaController(fixed=3))
    pp = PipelineProjector(heads[0], heads[1], split_layers(5, 5), UART_921600.name)
    p = pp.project(r, len(prompt))
    first = r.rounds[0]
    assert pp.replay(r.rounds)[0][1] == pytest.approx(
        pp.wavefront(first.pos0 - 1, first.gamma + 1, 0, judged(first) - 1, draft_entries(first)))
    n = len(prompt) - 1
    assert p["prefill_s"] == pytest.approx(pp.wavefront(0, n, n, n, [])) and p["prefill_s"] > 0
    assert pp.prefill_seconds(1) == 0.0


def test_a_run_projected_on_s3_stages_keeps_the_classic_links(heads):
    from specmesh.host.projection.pipeline import LinksReport

    tok = Tokenizer.from_llama2c(MODELS / "tokenizer.bin")
    prompt = tok.encode("Once upon a time")
    r = generate(prompt, LocalVerifier(MODELS / TARGET_FILE), LocalDrafter(MODELS / DRAFTER_FILE),
                 SessionParams(), 24, GammaController(fixed=3))
    p = LinksReport(heads[0], heads[1], split_layers(5, 5), board="esp32s3").project(r, len(prompt))
    assert set(p["links"]) == {"usb-serial-jtag", "usb-serial-jtag+espnow-direct", "uart-921600", "espnow",
                               "uart-921600+espnow-direct"}
    assert p["hardware"] == p["links"]["usb-serial-jtag"]["hardware"] and "esp32s3 stages" in p["hardware"]
    assert "esp32 stages" in p["links"]["uart-921600"]["hardware"]
    # S3 stages: no classifier read per position, 1 ms USB messages instead of 3.9 ms UART lines
    assert p["speedup_vs_single_board_plain"] > 1.5 * p["links"]["uart-921600"]["speedup_vs_single_board_plain"]


def test_rows_board_to_board_over_espnow_against_relayed_through_the_host(heads):
    """One ESP-NOW hop (a packed row is one 250-byte packet: 2.9 ms) instead of a reply to the host and a request
    to the next stage: it beats two 921600-baud lines (2 x 2.9 ms), not two USB messages (2 x 1.2 ms)."""
    from specmesh.host.projection.hardware import ESPNOW, USB_SERIAL_JTAG

    target, drafter = heads
    layers = split_layers(5, 5)
    pairs = {}
    for cls, host in (("esp32", UART_921600.name), ("esp32s3", USB_SERIAL_JTAG.name)):
        relay = PipelineProjector(target, drafter, layers, host, board=cls)
        direct = PipelineProjector(target, drafter, layers, host + "+espnow-direct", board=cls)
        assert direct.hops == relay.hops and direct.direct and "board to board" in direct.label()
        row = stage_reply_body(relay.row(1))
        assert direct._hop_out(1, row) == pytest.approx(ESPNOW.seconds(row + 6))  # one packet, src and dst
        assert direct._hop_in(2, stage_body(0, relay.row(2))) == 0.0
        assert direct._hop_out(4, stage_reply_body(2)) == relay._hop_out(4, stage_reply_body(2))  # to the host
        pairs[cls] = (relay.wavefront(40, 5, 0, 4, [2] * 4), direct.wavefront(40, 5, 0, 4, [2] * 4))
    assert pairs["esp32"][1] < pairs["esp32"][0]  # board to board wins on UART
    assert pairs["esp32s3"][1] > pairs["esp32s3"][0]  # relaying wins on the S3's USB


def test_the_first_position_sent_at_the_verdict_overlaps_the_drafting(heads):
    """The host sends a round's first position out at the last verdict and relays it through every stage but
    the last while the drafts are made: a round whose drafts took `lead` seconds starts that much ahead,
    up to the position's way to the last stage, which waits for the drafts."""
    pp = PipelineProjector(heads[0], heads[1], split_layers(5, 5), UART_921600.name)
    first = pp._wire(stage_body(0, 2)) + pp._stage(0, 41, False) + pp._wire(stage_reply_body(pp.row(1)))
    way = first + sum(pp._wire(stage_body(0, pp.row(s))) + pp._stage(s, 41, False)
                      + pp._wire(stage_reply_body(pp.row(s + 1))) for s in range(1, 4))
    base = pp.wavefront(40, 4, 0, 3, [2] * 3)
    assert pp.wavefront(40, 4, 0, 3, [2] * 3, lead=first / 2) == pytest.approx(base - first / 2)
    saturated = pp.wavefront(40, 4, 0, 3, [2] * 3, lead=way)
    assert saturated == pytest.approx(pp.wavefront(40, 4, 0, 3, [2] * 3, lead=10 * way))
    assert saturated < base - first
    one = PipelineProjector(heads[0], heads[1], split_layers(5, 1), UART_921600.name)  # its stage judges it
    assert one.wavefront(40, 4, 0, 3, [2] * 3, lead=way) == pytest.approx(one.wavefront(40, 4, 0, 3, [2] * 3))
    tok = Tokenizer.from_llama2c(MODELS / "tokenizer.bin")
    prompt = tok.encode("Once upon a time")
    r = generate(prompt, LocalVerifier(MODELS / TARGET_FILE), LocalDrafter(MODELS / DRAFTER_FILE),
                 SessionParams(), 24, GammaController(fixed=3))
    costs = pp.replay(r.rounds)
    x, (d, v, _) = r.rounds[2], costs[2]
    assert v == pytest.approx(pp.wavefront(x.pos0 - 1, x.gamma + 1, 0, judged(x) - 1, draft_entries(x), lead=d))
    assert v < pp.wavefront(x.pos0 - 1, x.gamma + 1, 0, judged(x) - 1, draft_entries(x))


