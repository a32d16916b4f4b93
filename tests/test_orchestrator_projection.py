"""Time-faithful projection (host/projection.py, host/hardware.py): message sizes from the real codec,
MAC counts from the model layout, and a plain run projecting to exactly the plain baseline."""

import pytest

from host.hardware import BOARDS, ESPNOW, USB_SERIAL_JTAG, sources
from host.orchestrator import Result, Round
from host.projection import PLAIN_BODY, VERDICT_BODY, Projector, line_bytes, macs_per_position
from shared import messages as m
from shared.codec import encode, encode_line
from shared.modelfile import FLAG_SHARED_CLS, KIND_Q8, Header, body_size, tensor_layout

TARGET = Header(128, 6, 4, 2, 352, 512, 256, flags=FLAG_SHARED_CLS)
DRAFTER = Header(32, 2, 4, 2, 96, 512, 256, flags=FLAG_SHARED_CLS)


def test_line_bytes_is_what_the_codec_puts_on_the_wire():
    for n in range(0, 300, 7):
        assert line_bytes(n) == len(encode_line(encode(m.PING, b"x" * n, seq=5)))
        assert line_bytes(n, addressed=True) == len(encode_line(encode(m.PING, b"x" * n, src=0, dst=2, seq=5)))
    assert PLAIN_BODY == len(m.pack_draft(300, [])) and VERDICT_BODY == len(m.pack_verdict(4, 300))


@pytest.mark.parametrize("h", [TARGET, DRAFTER, Header(16, 1, 2, 1, 24, 40, 32)])
def test_macs_per_position_counts_every_weight_once_plus_attention(h):
    weights = sum(r * c for name, kind, r, c in tensor_layout(h) if kind == KIND_Q8 and name != "tok_emb")
    if h.flags & FLAG_SHARED_CLS:
        weights += h.vocab * h.dim  # the embedding doubles as the classifier
    ctx = 10
    attention = h.n_layers * 2 * h.n_heads * h.head_dim * ctx
    assert macs_per_position(h, ctx) == weights + attention


def plain_result(n, pos0):
    return Result(list(range(n)), [Round(0, 0, 1, pos0 + i, PLAIN_BODY, PLAIN_BODY, 0, False, 0, 0, 0, 0, 0, 0)
                                   for i in range(n)])


@pytest.mark.parametrize("transport", ["serial", "espnow"])
def test_plain_run_projects_to_the_plain_baseline(transport):
    p = Projector(TARGET, DRAFTER, "esp32s3", transport)
    proj = p.project(plain_result(20, 5), 5)
    assert proj["speedup_vs_plain"] == pytest.approx(1.0)
    assert proj["tokens_per_s"] == pytest.approx(proj["plain_tokens_per_s"])


def test_verify_cost_on_a_compute_bound_board_grows_with_positions():
    p = Projector(TARGET, DRAFTER, "esp32s3")
    one, five = p.forward(TARGET, 1, 50), p.forward(TARGET, 5, 54)
    stream = body_size(TARGET) / BOARDS["esp32s3"].weight_stream_bps.value  # PSRAM weights: read once
    assert five - stream == pytest.approx(5 * (one - stream), rel=0.01)  # no weight reuse in the MACs
    assert p.forward(DRAFTER, 1, 50) < one / 20  # the drafter sits in SRAM and is ~30x smaller


def test_espnow_adds_a_radio_hop_to_the_verifier_only():
    serial, radio = Projector(TARGET, DRAFTER, "esp32s3", "serial"), Projector(TARGET, DRAFTER, "esp32s3", "espnow")
    size = line_bytes(5, addressed=True) + line_bytes(7, addressed=True)  # frames behind the gateway carry addresses
    extra = ESPNOW.seconds(size, messages=2) + USB_SERIAL_JTAG.seconds(size - line_bytes(5) - line_bytes(7), 0)
    assert radio.call("verifier", 5, 7) - serial.call("verifier", 5, 7) == pytest.approx(extra)
    assert radio.call("drafter", 5, 7) == serial.call("drafter", 5, 7)
    assert USB_SERIAL_JTAG.seconds(0, 2) == pytest.approx(2e-3)


def test_every_constant_names_its_source_or_derivation():
    for row in sources():
        assert row["source"] in {"S3-DS", "ESP32-DS", "VIPER", "LLM", "ESPNOW", "ESPNOW-T", "USJ", "UART", "derived"}
        if row["source"] == "derived":
            assert len(row["note"]) > 40  # the derivation is spelled out
