"""Time-faithful projection (host/projection/rounds.py, host/projection/hardware.py): message sizes from the real codec,
MAC counts from the model layout, and a plain run projecting to exactly the plain baseline."""

import re

import pytest

from specmesh.host.projection import hardware
from specmesh.host.projection.costmodel import TERMS
from specmesh.host.projection.hardware import (BOARDS, CONSOLE_WAKE, CONSOLES, CPI, ESPNOW, FREERTOS_TICK,
                                               NODE_FRAME_BYTE_INSNS, NODE_FRAME_INSNS, USB_SERIAL_JTAG, sources)
from specmesh.host.decode.orchestrator import Result, Round
from specmesh.host.projection.rounds import (PLAIN_BODY, VERDICT_BODY, Projector, draft_entries, frame_bytes,
                                    line_bytes, macs_per_position, stage_body, stage_reply_body, weight_bytes)
from specmesh.shared import messages as m
from specmesh.shared.codec import encode, encode_line
from specmesh.shared.modelfile import FLAG_SHARED_CLS, KIND_Q8, Header, body_size, tensor_layout

TARGET = Header(128, 6, 4, 2, 352, 512, 256, flags=FLAG_SHARED_CLS)
DRAFTER = Header(32, 2, 4, 2, 96, 512, 256, flags=FLAG_SHARED_CLS)


def test_line_bytes_is_what_the_codec_puts_on_the_wire():
    for n in range(0, 300, 7):
        assert line_bytes(n) == len(encode_line(encode(m.PING, b"x" * n, seq=5)))
        assert line_bytes(n, addressed=True) == len(encode_line(encode(m.PING, b"x" * n, src=0, dst=2, seq=5)))
    assert PLAIN_BODY == len(m.pack_draft(300, [])) and VERDICT_BODY == len(m.pack_verdict(4, 300))


@pytest.mark.parametrize("entries", [[], [(7, [7], [m.ONE])] * 3, [(7, [2, 7, 300], [100, m.ONE - 400, 300]),
                                                                   (9, [9, 40], [m.ONE - 1, 1])]])
def test_stage_bytes_are_what_the_codec_packs(entries):
    """The pipeline projection's STAGE sizes: one position per request, its draft's entry as in DRAFT."""
    draft = len(m.pack_draft(5, entries))
    r = Round(gamma=len(entries), n_accepted=0, n_committed=1, pos0=5, draft_body=draft, verify_body=0)
    assert sum(draft_entries(r)) == sum(len(m.pack_draft(5, [e])) - 3 for e in entries)
    for data in (b"\x01\x00", bytes(4 * 64)):
        assert stage_body(0, len(data)) == len(m.pack_stage(300, 1, m.STAGE_ACT, [], data))
        for e in entries:
            size = len(m.pack_draft(5, [e])) - 3  # the entry alone, as draft_entries counts it
            assert stage_body(size, len(data)) == len(m.pack_stage(300, 1, m.STAGE_HEAD, [e], data))
        assert stage_reply_body(len(data)) == len(m.pack_stage_reply(300, 1, m.STAGE_ACT, data))


@pytest.mark.parametrize("h", [TARGET, DRAFTER, Header(16, 1, 2, 1, 24, 40, 32)])
def test_macs_per_position_counts_every_weight_once_plus_attention(h):
    weights = sum(r * c for name, kind, r, c in tensor_layout(h) if kind == KIND_Q8 and name != "tok_emb")
    if h.flags & FLAG_SHARED_CLS:
        weights += h.vocab * h.dim  # the embedding doubles as the classifier
    ctx = 10
    attention = h.n_layers * 2 * h.n_heads * h.head_dim * ctx
    assert macs_per_position(h, ctx) == weights + attention


def plain_result(n, pos0):
    return Result(list(range(n)), [Round(gamma=0, n_accepted=0, n_committed=1, pos0=pos0 + i, draft_body=PLAIN_BODY,
                                         verify_body=PLAIN_BODY)
                                   for i in range(n)])


@pytest.mark.parametrize("transport", ["serial", "espnow"])
def test_plain_run_projects_to_the_plain_baseline(transport):
    p = Projector(TARGET, DRAFTER, "esp32s3", transport)
    proj = p.project(plain_result(20, 5), 5)
    assert proj["speedup_vs_plain"] == pytest.approx(1.0)
    assert proj["tokens_per_s"] == pytest.approx(proj["plain_tokens_per_s"])


def test_verify_cost_on_a_compute_bound_board_grows_with_positions():
    p = Projector(TARGET, DRAFTER, "esp32s3")
    one, five = p.terms(TARGET, 1, 50), p.terms(TARGET, 5, 54)
    stream = body_size(TARGET) / BOARDS["esp32s3"].weight_stream_bps.value  # PSRAM weights: read once
    assert one["weights_psram"] == five["weights_psram"] == pytest.approx(stream)
    # the 5-position matmul shares each weight load (native: 3.6 instructions per MAC against 6)
    assert 2 * one["matmul_1"] < five["matmul_5"] < 3.5 * one["matmul_1"]
    assert 4.5 * one["rmsnorm"] < five["rmsnorm"] < 5.5 * one["rmsnorm"]  # per-position steps: k times
    assert 2 < sum(five.values()) / sum(one.values()) < 5
    drafter = p.terms(DRAFTER, 1, 50)
    assert "weights_psram" not in drafter and "kv_psram" not in drafter  # the drafter sits in SRAM
    assert sum(drafter.values()) < sum(one.values()) / 5


def test_every_step_of_the_engine_is_a_term_and_attention_grows_with_context():
    p = Projector(TARGET, DRAFTER, "esp32s3")
    short, long = p.terms(TARGET, 1, 10), p.terms(TARGET, 1, 210)
    assert set(short) == set(TERMS) - {"matmul_5", "weights_flash"}  # an S3 keeps the target in PSRAM
    assert all(v > 0 for v in short.values())
    for t in ("kv_reads", "kv_psram"):  # per cached position
        assert long[t] == pytest.approx(21 * short[t])
    assert long["softmax"] > 5 * short["softmax"]  # per cached position, plus a per-head set-up
    for t in ("matmul_1", "rmsnorm", "silu", "rope", "weights_psram"):  # independent of the context
        assert long[t] == short[t]


def test_espnow_adds_a_radio_hop_to_the_verifier_only():
    """Serial: the S3 verifier on its own stock console (TinyUSB CDC, replies mirrored to UART0 at 115200); ESP-NOW:
    through the gateway's (the classic ESP32 drafter's UART0 console), then the radio hop, frames with addresses;
    both pay the verifier node's own Python for the two frames."""
    serial, radio = Projector(TARGET, DRAFTER, "esp32s3", "serial"), Projector(TARGET, DRAFTER, "esp32s3", "espnow")

    def node(addressed: bool) -> float:
        insns = NODE_FRAME_INSNS.value + NODE_FRAME_BYTE_INSNS.value * (frame_bytes(5, addressed)
                                                                        + frame_bytes(7, addressed))
        return insns * CPI.value / 240e6

    up, down = line_bytes(5, addressed=True), line_bytes(7, addressed=True)  # frames behind the gateway: addresses
    assert radio.call("verifier", 5, 7) == pytest.approx(
        CONSOLES["esp32"].exchange_seconds(up, down) + ESPNOW.exchange_seconds(up, down) + node(True))
    assert serial.call("verifier", 5, 7) == pytest.approx(
        CONSOLES["esp32s3"].exchange_seconds(line_bytes(5), line_bytes(7)) + node(False))
    assert radio.call("drafter", 5, 7) == serial.call("drafter", 5, 7)
    assert USB_SERIAL_JTAG.seconds(0, 2) == pytest.approx(2e-3)


def test_stock_consoles_price_the_uart0_mirror_and_the_tick():
    """[MPY-ESP32]: a stock S3/C3 request and reply are USB messages, and the reply is first written to UART0's TX
    FIFO, which holds 128 bytes: a longer reply waits for the UART at 115200, a FreeRTOS tick at a time; a frame on
    a classic ESP32's UART console waits half its node's 1 ms waker period, an ESP-NOW frame half a FreeRTOS tick
    at each end."""
    s3 = CONSOLES["esp32s3"]
    assert s3.exchange_seconds(100, 0) == pytest.approx(100 * 8 / 12e6 + 2e-3)
    assert s3.exchange_seconds(0, 128) - s3.exchange_seconds(0, 0) == pytest.approx(128 * 8 / 12e6)  # the FIFO's
    # 200 bytes: 72 wait; the first sleep ends at the next tick, u in 0..10 ms, when 11.52 u bytes have drained:
    # done then if u >= 6.25 ms, else one tick later; on average 5 + 10 x 0.625 = 11.25 ms
    mirror = s3.exchange_seconds(0, 200) - s3.exchange_seconds(0, 0) - 200 * 8 / 12e6
    assert mirror == pytest.approx(11.25e-3, abs=0.2e-3)
    assert CONSOLES["esp32c3"].exchange_seconds(0, 200) == pytest.approx(s3.exchange_seconds(0, 200))
    uart = CONSOLES["esp32"]
    assert uart.exchange_seconds(0, 0) == pytest.approx(CONSOLE_WAKE.value / 2)
    assert CONSOLE_WAKE.value < FREERTOS_TICK.value
    assert ESPNOW.exchange_seconds(0, 0) - ESPNOW.seconds(0, 2) == pytest.approx(FREERTOS_TICK.value)
    assert "ESP32_GENERIC v1.28, 240 MHz (set by the node; 160 at boot)" in Projector(TARGET, DRAFTER, "esp32").project(
        Result([]), 1)["hardware"]


def test_every_constant_names_its_source_or_derivation():
    listed = set(re.findall(r"^\[([A-Z0-9-]+)\]", hardware.__doc__, re.M))  # the docstring's source list
    assert {"S3-DS", "ESP32-DS", "ESPNOW", "USJ", "UART", "HOST"} <= listed
    for row in sources():
        assert row["source"] in listed | {"derived"}
        if row["source"] == "derived":
            assert len(row["note"]) > 40  # the derivation is spelled out


@pytest.mark.parametrize("h", [TARGET, DRAFTER, Header(16, 3, 2, 1, 24, 40, 32)])
def test_a_pass_splits_into_stages_that_add_up(h):
    full = macs_per_position(h, 9)
    cut = h.n_layers // 2
    assert macs_per_position(h, 9, (0, cut), False) + macs_per_position(h, 9, (cut, h.n_layers)) == full
    assert macs_per_position(h, 9, (0, 0), True) == h.vocab * h.dim  # the classifier alone
    assert weight_bytes(h) == body_size(h)
    assert weight_bytes(h, (0, cut), False) + weight_bytes(h, (cut, h.n_layers), True) >= body_size(h)
    with pytest.raises(ValueError):
        macs_per_position(h, 9, (0, h.n_layers + 1))


def test_a_stage_pays_only_its_own_layers():
    p = Projector(DRAFTER, DRAFTER, "esp32s3")  # in SRAM: time is MACs only
    whole = p.forward(DRAFTER, 5, 20)
    assert p.forward(DRAFTER, 5, 20, layers=(0, 1), classifier=False) + p.forward(
        DRAFTER, 5, 20, layers=(1, 2), classifier=True) == pytest.approx(whole)
    assert p.forward(DRAFTER, 5, 20, layers=(0, 2), classifier=False) < whole
