"""Distil a drafter from the shipped target: KL to the target's distributions and acceptance-shaped losses
(the total variation to the drafter's q-hat, 1 - alpha at T = 1, and the drafter's log-probability of the
target's greedy token, a smooth 1 - alpha at T = 0: DistillSpec, Zhou et al. 2023) on stories the target
samples itself and on TinyStories text, with a progress bar, an optional time budget and resumable checkpoints.

The data is unlimited and exactly the distribution the drafter must match: every `--refresh` steps the
target samples a new pool of stories from a generator seeded by (seed, pool number), so a resumed run
sees the same data as an uninterrupted one. `--temps` mixes sampling temperatures: stories sampled
cooler look like the target's greedy text, where a greedy drafter is judged (0: the greedy text itself).
`--openings FILE` starts each story with the first 4-48 tokens of a real paragraph, so the pool holds what
a drafter meets after a user's prompt; `--text-share F` makes that fraction of the pool rows windows of
the paragraphs themselves (the target's distributions on real text, as a user's prompt is). Model selection uses held-out prompts (the first 16 tokens of the first `--val-stories`
of models/heldout.txt, which the model card does not measure on) continued by the target at T = 1:
teacher-forced agreement of the two models on the continuations, the i.i.d. acceptance at T = 0 (argmax
equal) and T = 1 (sum of min(p, q-hat)), and the KL; and on the same prompts continued greedily, the
greedy acceptance (`alpha_greedy`: on the target's own greedy text, argmax equal), which `--select
alpha_greedy` chooses checkpoints by.

Checkpoints go to <out>/last.pt (every eval) and <out>/best.pt (highest `--select` figure); re-running
the same command resumes from last.pt. `--init` starts from a checkpoint or from a shipped model file
(its int8 weights dequantized), for a phase that refines a drafter; `--init-layers` from a subset of the
target's own layers (a host drafter of the target's layer shape, fewer layers).

    python -m specmesh.tools.train --shape d64l2kv1 --out checkpoints/d64 --openings models/tinystories_train_head.txt
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from specmesh.tools import DEFAULT, run_tool, without_torch

try:
    import torch
    import torch.nn.functional as F
except ImportError as e:  # the `gpu` extra
    without_torch(e, __name__)
from tqdm import tqdm

from specmesh.host import atomic
from specmesh.host.backends.modelio import check_model_file
from specmesh.host.cli.flags import a_path
from specmesh.host.cli.ranges import SEED, RangeError, in_range, shown
from specmesh.host.decode.tokenizer import Tokenizer
from specmesh.host.layout import MODELS, TARGET_FILE
from specmesh.tools.heldout import PROMPT_TOKENS, heldout_stories
from specmesh.tools.modeldefs import (DRAFTERS, CheckpointError, Transformer, from_model_file, layer_subset,
                                      load_weights, read_pt)

MIN_OPENING, MAX_OPENING = 4, 48  # real tokens a pool row opens with, after BOS


@torch.no_grad()
def agreement(student: Transformer, teacher: Transformer, x: torch.Tensor, mask: torch.Tensor, k: int) -> dict:
    """Teacher-forced agreement on x: i.i.d. acceptance at T = 0 and at T = 1 with the drafter's top-k
    q-hat (as the rule sees it), and KL(teacher || student)."""
    student.eval()
    p = torch.softmax(teacher(x)[:, :-1].float(), -1)[mask]
    lq = torch.log_softmax(student(x)[:, :-1].float(), -1)[mask]
    student.train()
    q = lq.exp()
    return {"alpha_t0": float((p.argmax(-1) == q.argmax(-1)).float().mean()),
            "alpha_t1": float(torch.minimum(p, qhat(lq, k)).sum(-1).mean()),
            "kl": float((p * (p.clamp_min(1e-12).log() - lq)).sum(-1).mean())}


def text_windows(openings: list[list[int]], n: int, length: int, g: torch.Generator) -> torch.Tensor:
    """n windows [n, length + 1] of the paragraphs `openings` laid end to end (each from its BOS), at random
    offsets: real text for the target to score."""
    stream = torch.tensor([t for ids in openings for t in ids])
    start = torch.randint(0, len(stream) - length - 1, (n,), generator=g)
    return torch.stack([stream[s:s + length + 1] for s in start.tolist()])


def openings_of(tok: Tokenizer, path: Path) -> list[list[int]]:
    """Token lists (from BOS) of the paragraphs of a text file (blank-line separated), for pool openings."""
    return [ids for ids in (tok.encode(s) for s in heldout_stories(path)) if len(ids) > MIN_OPENING]


@torch.no_grad()
def target_pool(teacher: Transformer, a, pool_id: int, openings: list[list[int]] | None) -> tuple[torch.Tensor, torch.Tensor]:
    """A pool of `a.pool` stories the target samples (seeded by seed and pool number) and the target's
    log-probabilities at each of their positions (float16, computed once for all the batches drawn).
    With `openings`, each row opens with the first MIN_OPENING to MAX_OPENING tokens of a paragraph drawn
    from them and the target continues it: the text a drafter meets after a user's prompt."""
    g = torch.Generator().manual_seed(a.seed * 1_000_003 + pool_id)
    rows = None
    if openings:
        pick = torch.randint(0, len(openings), (a.pool,), generator=g).tolist()
        cut = torch.randint(MIN_OPENING, MAX_OPENING + 1, (a.pool,), generator=g).tolist()
        rows = [openings[i][:1 + c] for i, c in zip(pick, cut)]
    n_text = int(a.pool * a.text_share) if openings else 0
    # --text-share 1: every row is the paragraphs' (the target sampling no row was torch's reshape error)
    sampled = [teacher.sample(a.pool - n_text, a.seq, g, a.temps, rows[n_text:] if rows else None)] \
        if n_text < a.pool else []
    pool = torch.cat(([text_windows(openings, n_text, a.seq, g)] if n_text else []) + sampled)
    lp = torch.cat([torch.log_softmax(teacher(pool[i:i + 64, :-1]), -1).half() for i in range(0, a.pool, 64)])
    return pool, lp


@torch.no_grad()
def continued_prompts(teacher: Transformer, tok: Tokenizer, stories: list[str], new: int,
                      temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, mask of the positions to score): each story's first PROMPT_TOKENS tokens continued by the
    target at `temperature` for `new` tokens (a fixed seed), scored on the continuation only: the text the
    model card measures acceptance on, from stories it does not measure."""
    prompts = [ids[:PROMPT_TOKENS] for ids in (tok.encode(s) for s in stories) if len(ids) >= PROMPT_TOKENS]
    x = teacher.sample(len(prompts), PROMPT_TOKENS + new - 1, torch.Generator().manual_seed(0), (temperature,), prompts)
    mask = torch.zeros(x.shape[0], x.shape[1] - 1, dtype=torch.bool)
    mask[:, PROMPT_TOKENS - 1:] = True
    return x, mask


def qhat(lq: torch.Tensor, k: int) -> torch.Tensor:
    """The drafter's q-hat from its log-probabilities: its top k, renormalised (the rule's draft table)."""
    top, ids = lq.exp().topk(k, -1)
    return torch.zeros_like(lq).scatter(-1, ids, top / top.sum(-1, keepdim=True))


LOSSES = ("kl", "tv", "greedy")


def loss_terms(spec: str) -> dict[str, float]:
    """`--loss` as {term: weight}: "kl", or weighted terms such as "kl:1,tv:1,greedy:0.5"."""
    terms = {}
    for part in spec.split(","):
        name, _, w = part.partition(":")
        if name not in LOSSES:
            raise argparse.ArgumentTypeError("unknown loss term %r (terms: %s)" % (name, ", ".join(LOSSES)))
        try:
            terms[name] = float(w) if w else 1.0
        except ValueError:
            raise argparse.ArgumentTypeError("loss weight %r is not a number" % w) from None
        # a negative weight trained the drafter away from the target; nan or inf made every loss nan
        if not 0 <= terms[name] < math.inf:
            raise argparse.ArgumentTypeError("loss weight %r must be a number of at least 0 (e.g. kl:1,tv:1,greedy:0.5)"
                                             % w)
    return terms


def distil_loss(lq: torch.Tensor, tl: torch.Tensor, terms: dict[str, float], k: int) -> torch.Tensor:
    """The weighted loss terms on drafter log-probabilities lq and target log-probabilities tl ([N, vocab]):
    kl KL(target || drafter); tv the total variation between the target and the drafter's q-hat (its top
    k, renormalised: exactly what the rule accepts with), 1 - alpha at T = 1; greedy the drafter's
    negative log-probability of the target's argmax, a smooth stand-in for 1 - alpha at T = 0."""
    loss = lq.new_zeros(())
    if "kl" in terms:
        loss = loss + terms["kl"] * F.kl_div(lq, tl, log_target=True, reduction="batchmean")
    if "tv" in terms:
        loss = loss + terms["tv"] * 0.5 * (tl.exp() - qhat(lq, k)).abs().sum(-1).mean()
    if "greedy" in terms:
        loss = loss + terms["greedy"] * F.nll_loss(lq, tl.argmax(-1))
    return loss


def initial_weights(path: Path) -> dict:
    """A state dict to start from: a checkpoint's, or a model file's (int8 weights dequantized)."""
    if path.suffix == ".pt":
        return read_pt(path)["model"]
    return from_model_file(path).state_dict()


def lr_at(step: int, train_s: float, a) -> float:
    """Linear warm-up, then cosine decay to 10% over the run's progress: the larger of the step
    fraction and the time-budget fraction, so a run on a busy machine still ends fully decayed."""
    if step < a.warmup:
        return a.lr * (step + 1) / a.warmup
    t = (step - a.warmup) / max(1, a.steps - a.warmup)
    if a.minutes:
        t = max(t, train_s / (a.minutes * 60))
    return a.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, t))))


def train(a) -> dict:
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    teacher = from_model_file(a.teacher)
    for p in teacher.parameters():
        p.requires_grad_(False)
    tok = Tokenizer.from_llama2c(a.tokenizer)
    val_stories = heldout_stories(a.heldout)[:a.val_stories]
    val_x, val_mask = continued_prompts(teacher, tok, val_stories, a.val_new)
    greedy_x, greedy_mask = continued_prompts(teacher, tok, val_stories, a.val_new, 0.0)
    terms = loss_terms(a.loss)
    openings = openings_of(tok, a.openings) if a.openings else None
    cfg = DRAFTERS[a.shape]
    model = Transformer(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.01, betas=(0.9, 0.95))
    state = {"step": 0, "train_s": 0.0, "best": -1.0, "history": []}
    last = out / "last.pt"
    if last.exists():
        ck = read_pt(last)
        load_weights(model, ck["model"], str(last), "--shape " + a.shape, "give its own --shape to resume it, or another --out")
        opt.load_state_dict(ck["opt"])
        state = ck["state"]
        print("resuming %s at step %d" % (last, state["step"]))
    elif a.init:
        load_weights(model, initial_weights(a.init), "--init %s" % a.init, "--shape " + a.shape, "give the --shape it has")
    elif a.init_layers:
        load_weights(model, layer_subset(teacher.state_dict(), a.init_layers), "the target %s" % a.teacher,
                     "--shape " + a.shape, "give a --shape of its layer shape")

    def save(path: Path):
        with atomic.replacing(path) as f:  # a checkpoint interrupted mid-write keeps the previous one
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "state": state,
                        "config": cfg.to_dict(), "shape": a.shape,
                        "args": {k: str(v) for k, v in vars(a).items()}}, f)

    if a.minutes and state["train_s"] >= a.minutes * 60:
        print("%s already used its %g min budget" % (last, a.minutes))
        a.steps = state["step"]
    t0 = time.time() - state["train_s"]
    pool = pool_lp = None
    pool_id = -1
    end = min(a.steps, a.stop_at or a.steps)
    bar = tqdm(range(state["step"], end), initial=state["step"], total=end, desc=a.shape,
               mininterval=10, file=sys.stdout)
    for step in bar:
        if step // a.refresh != pool_id:  # a new pool of target stories, a pure function of (seed, pool)
            pool_id = step // a.refresh
            pool, pool_lp = target_pool(teacher, a, pool_id, openings)
        for grp in opt.param_groups:
            grp["lr"] = lr_at(step, time.time() - t0, a)
        g = torch.Generator().manual_seed(a.seed * 7_919 + step)
        rows = torch.randint(0, a.pool, (a.batch,), generator=g)
        x, tl = pool[rows, :-1], pool_lp[rows].float().flatten(0, 1)
        lq = torch.log_softmax(model(x), -1).flatten(0, 1)
        loss = distil_loss(lq, tl, terms, a.draft_top_k)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        state["step"] = step + 1
        state["train_s"] = time.time() - t0
        bar.set_postfix(loss="%.3f" % loss.item(), lr="%.1e" % opt.param_groups[0]["lr"], refresh=False)
        over = a.minutes and state["train_s"] > a.minutes * 60
        if state["step"] % a.eval_every == 0 or state["step"] == end or over:
            ev = agreement(model, teacher, val_x, val_mask, a.draft_top_k)
            ev["alpha_greedy"] = agreement(model, teacher, greedy_x, greedy_mask, a.draft_top_k)["alpha_t0"]
            state["history"].append((state["step"], round(state["train_s"], 1), round(loss.item(), 4),
                                     {k: round(v, 4) for k, v in ev.items()}))
            bar.write("step %d  %.0fs  train %s %.4f  held-out %s" % (
                state["step"], state["train_s"], a.loss, loss.item(), " ".join("%s %.4f" % kv for kv in ev.items())))
            if ev[a.select] > state["best"]:
                state["best"] = ev[a.select]
                save(out / "best.pt")
            save(last)
            if over:
                bar.write("time budget of %g min reached" % a.minutes)
                break
    bar.close()
    summary = {"shape": a.shape, "params": model.n_params(), "steps": state["step"],
               "train_s": round(state["train_s"], 1), "best_heldout_" + a.select: state["best"]}
    atomic.write_text(out / "summary.json", json.dumps(summary | {"history": state["history"]}, indent=1))
    return summary


def _comma_separated(kind: type, what: str, example: str):
    """An argparse type: values of `kind` separated by commas (--temps, --init-layers); a bad one names `what` it
    takes with an `example` (argparse's own line named a lambda: "invalid <lambda> value")."""
    def parse(text: str) -> tuple:
        try:
            return tuple(kind(x) for x in text.split(","))
        except ValueError:
            raise argparse.ArgumentTypeError("%r is not %s separated by commas (e.g. %s)" % (text, what, example)) \
                from None
    return parse


def _out_problem(out: str) -> str | None:
    """Why --out cannot be the checkpoint folder, or None: empty (an unset shell variable's), which trained into the
    folder it was run in, or a file on its way, which was "train: OUT: File exists" once the target had loaded."""
    if not out.strip():
        return "--out is empty: give the folder for the checkpoints (an unset shell variable?)"
    on_way = next((p for p in (Path(out), *Path(out).parents) if p.exists()), None)
    if on_way is not None and not on_way.is_dir():
        where = "" if on_way == Path(out) else ": %s" % on_way
        return "--out %s%s is a file, not a folder: give the folder for the checkpoints" % (out, where)
    return None


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m specmesh.tools.train", description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(DRAFTERS), required=True,
                    help="the drafter's shape, d<dim>l<layers>... (tools/modeldefs.py DRAFTERS; t64l4: the target's "
                         "layer shape, 4 layers)")
    ap.add_argument("--out", required=True, help="checkpoint directory")
    ap.add_argument("--teacher", type=a_path, default=MODELS / TARGET_FILE,
                    help="the target model file (default: models/target.spm)")
    ap.add_argument("--tokenizer", type=a_path, default=MODELS / "tokenizer.bin",
                    help="the target's llama2.c tokenizer.bin (default: models/tokenizer.bin)")
    ap.add_argument("--heldout", type=a_path, default=MODELS / "heldout.txt",
                    help="held-out stories, blank-line separated (default: models/heldout.txt)")
    ap.add_argument("--val-stories", type=int, default=64,
                    help="the first N held-out stories, whose prompts select best.pt (default: %(default)s)")
    ap.add_argument("--val-new", type=int, default=96,
                    help="tokens the target continues each held-out prompt with (default: %(default)s)")
    ap.add_argument("--openings", type=a_path, help="paragraphs (blank-line separated) the pool rows open with")
    ap.add_argument("--text-share", type=float, default=0.0,
                    help="with --openings: this fraction of each pool is windows of the paragraphs themselves")
    ap.add_argument("--init", type=a_path, help="start from this checkpoint's (.pt) or model file's (.spm) weights")
    ap.add_argument("--init-layers", type=_comma_separated(int, "layer numbers", "0,1,2,4"),
                    help="start from these layers of the target (e.g. 0,1,2,4), its embedding and final norm: "
                         "a --shape of the target's layer shape (t64l4) with as many layers")
    ap.add_argument("--loss", default="kl",
                    help="weighted terms, e.g. kl or kl:1,tv:1,greedy:0.5: KL(target || drafter); tv the total "
                         "variation between the target and the drafter's q-hat, 1 - alpha at T = 1; greedy the "
                         "drafter's log-probability of the target's argmax (alpha at T = 0); weights of at least 0"
                         + DEFAULT)
    ap.add_argument("--select", choices=("alpha_t1", "alpha_greedy"), default="alpha_t1",
                    help="the held-out figure best.pt is chosen by" + DEFAULT)
    ap.add_argument("--draft-top-k", type=int, default=8, help="q-hat size the tv loss assumes (default: 8)")
    ap.add_argument("--steps", type=int, default=20000, help="optimizer steps, the schedule's length" + DEFAULT)
    ap.add_argument("--minutes", type=float, default=0,
                    help="stop after this many minutes of training, the schedule decayed by then (default: 0, none)")
    ap.add_argument("--stop-at", type=int, default=0,
                    help="stop after this step, the schedule still that of --steps (a shorter run of the same phase; "
                         "default: 0, at --steps)")
    ap.add_argument("--batch", type=int, default=32, help="pool rows a step" + DEFAULT)
    ap.add_argument("--seq", type=int, default=256, help="tokens a pool row, up to the shape's context" + DEFAULT)
    ap.add_argument("--pool", type=int, default=1024, help="stories the target samples per pool" + DEFAULT)
    ap.add_argument("--temps", type=_comma_separated(float, "numbers", "1,0.5"), default=(1.0,),
                    help="temperatures the target samples the pool at, rows split evenly (e.g. 1,0.5; default: 1)")
    ap.add_argument("--refresh", type=int, default=160,
                    help="steps between pools (each story is drawn ~5 times; default: %(default)s)")
    ap.add_argument("--lr", type=float, default=3e-3,
                    help="peak learning rate, above 0: linear warm-up, then cosine decay to a tenth" + DEFAULT)
    ap.add_argument("--warmup", type=int, default=100, help="steps of the linear warm-up" + DEFAULT)
    ap.add_argument("--eval-every", type=int, default=100,
                    help="steps between held-out evaluations, each saving last.pt" + DEFAULT)
    ap.add_argument("--seed", type=int, default=1234,
                    help="seed of the pools, batches and initial weights, 0..4294967295" + DEFAULT)
    ap.add_argument("--threads", type=int, default=1, help="PyTorch's CPU threads" + DEFAULT)
    return ap


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    problem = _out_problem(a.out)
    if problem:
        print("train: %s" % problem, file=sys.stderr)
        return 2
    try:
        loss_terms(a.loss)
    except argparse.ArgumentTypeError as e:
        print("train: %s" % e, file=sys.stderr)
        return 2
    if a.init_layers and (a.init or len(set(a.init_layers)) != DRAFTERS[a.shape].n_layers):
        print("train: --init-layers names %d distinct layers of the target, --shape %s has %d%s" % (
            len(set(a.init_layers)), a.shape, DRAFTERS[a.shape].n_layers, " (and not with --init)" if a.init else ""),
            file=sys.stderr)
        return 2
    for p in (a.teacher, a.tokenizer, a.heldout) + ((a.openings,) if a.openings else ()) + ((a.init,) if a.init else ()):
        if not p.exists():
            print("train: %s not found" % p, file=sys.stderr)
            return 1
    try:
        checked(a)
    except RangeError as e:
        print("train: %s" % e, file=sys.stderr)
        return 2
    except ValueError as e:  # a text that is not UTF-8 or holds no story
        print("train: %s" % e, file=sys.stderr)
        return 1
    try:
        print(json.dumps(train(a)))
    except CheckpointError as e:
        print("train: %s" % e, file=sys.stderr)
        return 1
    return 0


def checked(a: argparse.Namespace) -> None:
    """RangeError for a flag no run can use (a zero batch, pool, refresh, eval period or step count; a --seq past the
    shape's context or too short for --openings; a learning rate not above 0; a seed past 32 bits; a layer the target
    lacks), ValueError for a --heldout or --openings text that is not UTF-8 or holds no story (--openings: no paragraph
    long enough to open a row, or too little text for --text-share's windows): said before the target loads, not as
    torch's error or a division by zero once it has."""
    cfg = DRAFTERS[a.shape]
    for flag, value, lo, hi in (("--batch", a.batch, 1, None), ("--pool", a.pool, 1, None),
                                ("--refresh", a.refresh, 1, None), ("--eval-every", a.eval_every, 1, None),
                                ("--val-stories", a.val_stories, 1, None), ("--val-new", a.val_new, 1, None),
                                ("--threads", a.threads, 1, None), ("--draft-top-k", a.draft_top_k, 1, cfg.vocab),
                                ("--seq", a.seq, 1, cfg.max_seq), ("--steps", a.steps, 1, None),
                                ("--warmup", a.warmup, 0, None), ("--stop-at", a.stop_at, 0, a.steps),
                                ("--minutes", a.minutes, 0, None), ("--text-share", a.text_share, 0, 1)):
        in_range(flag, value, lo, hi)
    for t in a.temps:
        in_range("--temps", t, 0)
    in_range("--seed", a.seed, *SEED)  # torch's generators take 64 bits: a larger one was its overflow's traceback
    if not 0 < a.lr < math.inf:  # was the optimizer's traceback
        raise RangeError("--lr must be a number above 0, not %s" % shown(a.lr))
    if a.openings:  # a row opens with up to MAX_OPENING tokens after BOS: a shorter --seq was torch's size error
        in_range("--seq", a.seq, MAX_OPENING, cfg.max_seq, note="with --openings: a row opens with up to %d tokens"
                 % MAX_OPENING)
    elif a.text_share:  # trained on no paragraph, unsaid
        raise RangeError("--text-share needs --openings: the paragraphs its windows are cut from")
    for flag, text in (("--heldout", a.heldout), ("--openings", a.openings)):
        if text is not None and not heldout_stories(text):
            raise ValueError("%s %s holds no story (paragraphs separated by blank lines)" % (flag, text))
    if a.openings:  # none long enough trained without openings, unsaid; too few tokens was torch's error in a pool
        tokens = [len(ids) for ids in openings_of(Tokenizer.from_llama2c(a.tokenizer), a.openings)]
        if not tokens:
            raise ValueError("--openings %s holds no paragraph of more than %d tokens: give longer paragraphs"
                             % (a.openings, MIN_OPENING))
        if a.text_share and sum(tokens) < a.seq + 2:
            raise ValueError("--openings %s holds %d tokens in its paragraphs, --text-share's windows of --seq %d take "
                             "at least %d: give more text" % (a.openings, sum(tokens), a.seq, a.seq + 2))
    if a.init_layers:
        h = check_model_file(a.teacher)[0]
        for i in a.init_layers:
            in_range("--init-layers", i, 0, h.n_layers - 1, note="the target's layers")
        if (cfg.dim, cfg.n_heads, cfg.n_kv_heads, cfg.hidden) != (h.dim, h.n_heads, h.n_kv_heads, h.hidden):
            raise RangeError("--init-layers needs a --shape of the target's layer shape (dim %d, %d heads, %d kv heads, "
                             "hidden %d), not %s" % (h.dim, h.n_heads, h.n_kv_heads, h.hidden, a.shape))


if __name__ == "__main__":
    run_tool("train", main)
