"""Context-lookup drafts: a greedy stream's next tokens proposed by copying them from the target's n-gram table or
its own history.

A tiny story model often repeats itself ("He likes to sing. He likes to sing."), and a small drafter
often fails to follow: on the report prompt whose target loops on one sentence, the classic ESP32's
drafter agreed with 28% of the target's tokens. When the stream's last tokens occurred before, the tokens
that followed them then are a proposal that costs nothing to draft (prompt lookup decoding, Saxena
2023): `continuation` finds the latest earlier occurrence of the longest suffix of at least MIN_MATCH
tokens (MAX_MATCH at most) and returns what came after it. The decode loop (host/decode/orchestrator.py)
sends such a block instead of a plain round's single position when the gamma controller says it pays
(host/decode/gamma.py `lookup_length`); the verifier judges it as it judges any draft, so the text is
the plain run's.

A drafter with an n-gram table (shared/ngram.py: a classic ESP32 board's, which the host reads from the file it
flashed) has the target's table as its `copies` (tools/ngram.py: the target's continuations counted as if no drafter
drafted anything right, where a drafter's own table leaves out what its drafter drafts right). `table_continuation`,
the chain of that table's tokens from the stream's end, is known on the host with no call. Where both hold copies,
the decode loop sends the source whose copies pay more at its own acceptance so far (host/decode/gamma.py
`lookup_pick`): the table's first (its prior is the higher), the history's once the table's have failed the stream,
as in a story that repeats itself where the table's chains lead elsewhere. The table first, the history where it held
nothing, was chosen before so: on the tuning set's 64 prompts (the classic-ESP32 drafter board, `python -m
specmesh.tools.bench projection`'s costs, the copies then from the drafter's table, which held the target's
continuations as this one does) copies from the history alone projected 1.567x / worst 1.219x, from the table alone
1.674x / 1.132x, the table then the history 1.678x / 1.187x, the history then the table 1.617x / 1.212x. Judged
apart (the tuning set's 16, the shipped tables, the lookup priced at 56.6e3), 1.766x / 1.280x against the table always
first's 1.770x / 1.280x: the same on those prompts, which rarely repeat themselves; on the report set 1.557x / 1.140x
against 1.539x / 1.110x. Greedy streams only: in a sampled one a copy would be a one-point q-hat table (lossless as
well), but every sampled text would change, and those stay bit for bit as they were.
"""

from __future__ import annotations

from collections.abc import Sequence

# the shortest suffix a copy may start from. On the tuning set's 16 prompts (their greedy targets, a copied first
# token against the target's): matched on 1 token or more 47% right (20% where only one matched), on 2 or more
# 76%, on 3 or more 83% but copying in a quarter fewer places. 2 projected best (tools/bench projection, tuning set)
MIN_MATCH = 2
MAX_MATCH = 6  # the longest suffix tried first: a longer match is likelier to continue the same way


def continuation(stream: Sequence[int], k: int, min_match: int = MIN_MATCH, max_match: int = MAX_MATCH) -> list[int]:
    """Up to k tokens that followed the latest earlier occurrence of the longest suffix of `stream` (between
    min_match and max_match tokens long) that occurred before; [] when none did."""
    n = len(stream)
    if k <= 0:
        return []
    for m in range(min(max_match, n - 1), min_match - 1, -1):
        suffix = list(stream[n - m:])
        first = suffix[0]
        for j in range(n - m - 1, -1, -1):  # an occurrence ending before the stream does
            if stream[j] == first and list(stream[j:j + m]) == suffix:
                return list(stream[j + m:j + m + k])
    return []


def table_continuation(table, stream: Sequence[int], k: int) -> list[int]:
    """Up to k tokens of the n-gram table's chain from the end of `stream`: its token after the stream, then after
    the stream and that token, and so on while it holds one (shared/ngram.py `Table.get`)."""
    seq, out = list(stream), []
    while len(out) < k:
        token = table.get(seq, len(seq))
        if token < 0:
            break
        out.append(token)
        seq.append(token)
    return out
