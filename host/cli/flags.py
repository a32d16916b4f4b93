"""The flags of `specmesh run` (and `chat`, and the options of `specmesh.Mesh`): their one definition, with
their defaults and help. llama.cpp's spellings are aliases where they mean the same (`-p`, `-f`, `-n`, `-s`,
`--temp`, `-r`, `-m`, `-md`, `--draft-max`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from specmesh.host.boardclasses import ESP32, ESP32S3
from specmesh.host.cli.config import DEFAULT_PROMPT, RV32_PROJECT
from specmesh.host.layout import HOST_DRAFTER_FILE, MODEL_FILES, MODELS, TOKENIZER_FILE


def a_path(text: str) -> Path:
    """A path flag's value; an empty one (an unset variable's `--models "$DIR"`) is refused, where Path("") would be
    the current folder, read without a word."""
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty: give a path (an unset shell variable?)")
    return Path(text)


def hide(p: argparse.ArgumentParser, dests: tuple[str, ...]) -> None:
    """Leave run's flags `dests` out of `p`'s help: a command that refuses them still parses them, to refuse each in
    its own one line rather than argparse's "unrecognized arguments"."""
    for action in p._actions:  # (argparse has no public list of a parser's actions)
        if action.dest in dests:
            action.help = argparse.SUPPRESS


def add_arguments(p: argparse.ArgumentParser, seed_help: str | None = None) -> None:
    """`specmesh run`'s flags on `p`; `seed_help`: --seed's help where it means something else (serve's: default None)."""
    # llama.cpp's spellings (-p, -f, -n, -s, --temp, -r, -m, -md, --draft-max) are aliases where they mean the same
    p.add_argument("-p", "--prompt", default=None,
                   help="text to continue, or - to read it from stdin (default: %r)" % DEFAULT_PROMPT)
    p.add_argument("-f", "--prompt-file", "--file", metavar="F", type=a_path, help="read the text to continue from file F (UTF-8)")
    p.add_argument("-r", "--stop", "--reverse-prompt", metavar="STRING", action="append", default=[],
                   help="end the text before this string (repeatable; the generated text only is searched)")
    p.add_argument("-n", "--max-tokens", "--n-predict", type=int, default=64, help="tokens to generate (default: %(default)s)")
    p.add_argument("--temperature", "--temp", type=float, default=0.0, help="0 = greedy (default: %(default)s)")
    p.add_argument("--top-k", type=int, default=0, help="target top-k, 0 = off (default: %(default)s)")
    p.add_argument("--top-p", type=float, default=1.0, help="target top-p, 1 = off (default: %(default)s)")
    p.add_argument("--draft-top-k", type=int, default=8, help="size of the drafter's q-hat tables (default: 8)")
    p.add_argument("-s", "--seed", type=int, default=0 if seed_help is None else None,
                   help=seed_help or "session seed: same seed, same text (default: 0)")
    p.add_argument("--drafter", default=None,
                   help="PORT (or mpremote's a0, u0, c0) | auto (the flashed drafter board among the ESP32 USB "
                        "ports) | virtual (the fast unix-port VM, sized as the role's class) | virtual:CLASS (a board of that "
                        "class running its own machine code under QEMU) | cpu (default: virtual)")
    p.add_argument("--verifier", default="virtual",
                   help="PORT | PORT1,PORT2,... (stage boards, in layer order) | auto | virtual | virtual:CLASS | cpu | "
                        "torch-cpu | gpu (default: virtual)")
    p.add_argument("--gamma", default="auto", help="drafts per round: auto, or a fixed K >= 0 (default: auto)")
    p.add_argument("--draft-max", type=int, default=None, metavar="N",
                   help="the most drafts automatic gamma takes in a round (default: the controller's own)")
    p.add_argument("--transport", choices=("serial", "espnow"), default="serial",
                   help="how virtual boards reach each other and the host (default: serial)")
    p.add_argument("--radio-loss", type=float, default=0.0, metavar="P",
                   help="virtual radio: probability a packet is lost (espnow transport; default 0)")
    p.add_argument("--radio-dup", type=float, default=0.0, metavar="P",
                   help="virtual radio: probability a packet arrives twice (default 0)")
    p.add_argument("--spec-ahead", type=int, default=0, metavar="N",
                   help="virtual drafter board: tokens it drafts ahead while a verdict is pending (pipelined "
                        "speculation; default 0). The virtual boards share the host's cores, so what it buys "
                        "depends on the machine's load (64 tokens at --gamma 2, median of 8 runs on 2 shared "
                        "cores: 821 tok/s without, 1087 with --spec-ahead 4)")
    p.add_argument("--plain", action="store_true", help="target-only decoding on the same verifier (baseline)")
    p.add_argument("--stages", type=int, default=0, metavar="N",
                   help="verify on a pipeline of N virtual stage boards (classic ESP32s; --verifier virtual:CLASS: of "
                        "that class), the target's layers split evenly, positions sent through as a wavefront; each "
                        "stage must fit its class's heap (the shipped target on classic ESP32s: 5) (docs/pipeline.md; "
                        "default 0: one verifier)")
    p.add_argument("--project", metavar="BOARD", choices=("esp32", "esp32s3") + RV32_PROJECT,
                   help="also project the run onto real boards of this class (host/projection/hardware.py); "
                        "gamma is then chosen for that hardware. esp32c3/esp32c6 price the instructions the run's "
                        "virtual:esp32c3/c6 boards executed under QEMU, and esp32/esp32s3 those of a virtual:esp32 "
                        "/ virtual:esp32s3 verifier (and drafter) when the run has them (docs/run.md)")
    p.add_argument("--kernels", choices=("native", "viper"), default=None,
                   help="with --project: the board kernels the projection prices (default native: the xtensawin "
                        "module; viper: the MicroPython-only engine)")
    p.add_argument("--calibration", metavar="FILE", type=a_path,
                   help="with --project: price the projection with a board's measurements (specmesh bench "
                        "--port PORT --out FILE) instead of the derived figures")
    p.add_argument("--drafter-calibration", metavar="FILE", type=a_path,
                   help="with --project: price the drafter board with its own measurements (specmesh bench on that "
                        "board: its flash read rate among them) instead of its class's derived figures")
    p.add_argument("--key-file", metavar="F", type=a_path,
                   help="sign and check every frame with this deployment key (boards flashed with the same "
                        "--key-file; virtual boards get it at flashing)")
    p.add_argument("--stats-json", metavar="FILE",
                   help="write the run's figures as JSON to FILE (a device, pipe or FIFO is written straight, a "
                        "symlink followed), or - for stdout in place of the text (which then goes to stderr)")
    p.add_argument("--models", type=a_path, default=MODELS,
                   help="folder with the target (%s), the drafters' model files and a llama2.c %s (default: the "
                        "shipped models)" % (MODEL_FILES["verifier"], TOKENIZER_FILE))
    p.add_argument("-m", "--model", metavar="FILE", type=a_path,
                   help="the target model file (default: %s in --models)" % MODEL_FILES["verifier"])
    p.add_argument("-md", "--draft-model", "--model-draft", metavar="FILE", type=a_path,
                   help="the drafter model file (default in --models: %s for --drafter cpu, a board its class's: %s "
                        "on a classic ESP32, the default virtual drafter, %s on an S3; a drafter board runs the model "
                        "it was flashed with, and the host reads that one from the same folder)"
                        % (HOST_DRAFTER_FILE, ESP32.drafter, ESP32S3.drafter))
    p.add_argument("--no-color", action="store_true", help="never colour the streamed text")
    p.add_argument("--quiet", action="store_true", help="no stats table and no progress on stderr (the text is still "
                   "on stdout; errors and fail-overs are still said)")
