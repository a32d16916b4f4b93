"""Roles: the drafter and the verifier, over one engine and one session's token sequence.

Both keep `tokens`, the committed prefix (length `length`) followed by tokens held speculatively
(`held` >= length: drafts of the drafter's chain, or the drafts a verifier last checked), and the
engine's KV cache over `tokens[:kv]`, kv <= held. COMMIT (alone, or folded into a DRAFT_REQ) writes the
new tail after any prefix of what the node holds; a verdict commits itself (the accepted drafts and
the emitted token), so a verifier needs no COMMIT while the host follows its verdicts. Every held token that
it confirms keeps its KV entry and (drafter) its draft, the first one it contradicts cuts `held` and
`kv` there. So accepted tokens are never recomputed, and anything computed from a rejected token is
dropped. ROLLBACK cuts everything beyond the length it names.

Positions: the logits for the token at absolute position p come from feeding tokens[p - 1] at
position p - 1. A verifier asked about drafts at pos0..pos0+n-1 therefore feeds tokens[pos0 - 1] and
the n drafts, at positions pos0 - 1 .. pos0 + n - 1, in one batched pass (n + 1 rows, the last
one gives the bonus distribution); its cache normally already holds tokens[:pos0 - 1].

Every random choice is `shared.rule` / `shared.prng` keyed by (seed, absolute position, purpose), so
a draft or verdict is a pure function of the seed and the prefix: a retried request, or a draft made
ahead of time (pipelined speculation, `spec_ahead`), gives exactly what a fresh computation gives.
"""

import time
from array import array

import cpucount
from shared import rule, sampling
from shared.messages import E_MESSAGE, E_RANGE, E_STATE, MAX_GAMMA, pack_table


class Refused(Exception):
    """A request the node answers with an ERROR reply: `code` and a one-line message."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


class Role:
    """Session state shared by both roles: parameters, token sequence, KV bookkeeping, counters."""

    def __init__(self, engine, stats):
        self.engine = engine
        self.stats = stats
        h = engine.header
        self.vocab = h.vocab
        self.max_seq = engine.n_ctx
        self.max_batch = engine.kmax
        self.tokens = array("H", bytes(2 * self.max_seq))
        self.active = False
        self.length = self.held = self.kv = 0

    def begin(self, seed, temp_milli, draft_top_k, target_top_k, top_p_q16, eos, prompt):
        n = len(prompt)
        if not 1 <= n <= self.max_seq:
            raise Refused(E_RANGE, "prompt of %d tokens: need 1..%d" % (n, self.max_seq))
        for t in prompt:
            if t >= self.vocab:
                raise Refused(E_RANGE, "prompt token %d is outside the vocabulary of %d" % (t, self.vocab))
        self.seed = seed
        self.temp_milli = temp_milli
        self.greedy = sampling.is_greedy(temp_milli)
        self.draft_top_k = max(1, min(draft_top_k, self.vocab))
        self.target_top_k = target_top_k
        self.top_p_q16 = top_p_q16
        self.eos = eos
        for i in range(n):
            self.tokens[i] = prompt[i]
        self._cut(0)
        self.length = self.held = n
        self.engine.rollback(0)
        self.active = True

    def _check_session(self):
        if not self.active:
            raise Refused(E_STATE, "no session: send BEGIN first")

    def commit(self, length, tail):
        self._check_session()
        base = length - len(tail)
        if base > self.held:
            raise Refused(E_STATE, "commit keeps %d tokens but the node holds only %d" % (base, self.held))
        if length > self.max_seq:
            raise Refused(E_RANGE, "commit to %d tokens exceeds the context of %d" % (length, self.max_seq))
        for t in tail:
            if t >= self.vocab:
                raise Refused(E_RANGE, "token %d is outside the vocabulary of %d" % (t, self.vocab))
        if length < 1:
            raise Refused(E_RANGE, "cannot commit an empty sequence")
        if length < self.length:  # a shorter sequence: nothing beyond `base` is held any more
            self._cut(base)
        for i in range(len(tail)):
            self._put(base + i, tail[i])
        self.length = length
        if self.held < length:
            self.held = length

    def rollback(self, length):
        self._check_session()
        if length > self.length:
            raise Refused(E_STATE, "cannot roll back to %d: only %d tokens are committed" % (length, self.length))
        if length < 1:
            raise Refused(E_RANGE, "cannot roll back past the first token")
        self.length = length
        self._cut(length)

    def _cut(self, p):
        """Hold nothing from position p on."""
        self.pending = None  # (a verifier's table of a rejected draft: its prefix may change)
        self.held = p
        if self.kv > p:
            self.kv = p

    def _put(self, p, t):
        """Set tokens[p] = t; if it contradicts a held token, drop what was computed from it."""
        if p < self.held and self.tokens[p] == t:
            return
        self._cut(p)
        self.tokens[p] = t
        self.held = p + 1

    def _feed(self, start, end):
        """Feed tokens[start:end] at positions start..; the cache then holds `end` positions.

        Returns the engine's logits array (row j at [j * vocab, (j + 1) * vocab), valid until the next pass)."""
        st = self.stats
        t0 = time.ticks_ms()
        tokens = memoryview(self.tokens)[start:end]  # before the count: the pass itself allocates nothing
        c0 = cpucount.start()
        self.engine.rollback(start)
        logits = self.engine.forward(tokens, start)
        cpucount.stop(c0, end - start)
        st["compute_ms"] += time.ticks_diff(time.ticks_ms(), t0)
        st["passes"] += 1
        st["positions"] += end - start
        self.kv = end
        return logits

    def _table(self, logits, j):
        """The target's table (sampling.table) of logits row j under the session's settings, built in the role's
        preallocated `bufs` (sampling.buffers): valid until the next call."""
        return sampling.table(memoryview(logits), j * self.vocab, self.vocab, self.temp_milli, self.target_top_k,
                              self.top_p_q16, self.engine.exp_table, self.bufs)

    def _catch_up(self, end):
        """Fill the cache up to position `end` (exclusive) in batches; no logits needed."""
        if self.kv > end:
            self.kv = end
        while self.kv < end:
            self._feed(self.kv, min(end, self.kv + self.max_batch))

    def idle_step(self):
        """One unit of background work; True if it did any."""
        return False


class Drafter(Role):
    """Drafts gamma tokens from the committed prefix, each sampled from the q-hat it sends."""

    def __init__(self, engine, stats, spec_ahead=0, table=None):
        Role.__init__(self, engine, stats)
        self.spec_ahead = min(spec_ahead, MAX_GAMMA)
        if table:  # the path of an n-gram table: greedy drafts where it holds the stream's last tokens
            from shared import ngram

            table = ngram.load(table)
        self.table = table
        # the q-hat tables of held drafts (messages.pack_table bytes; None when greedy), by position % MAX_GAMMA
        self.chain = [None] * MAX_GAMMA

    def begin(self, *args):
        """Start a session and prefill the prompt now, before the ACK: the host does not wait for it, so
        this overlaps the verifier's own prefill, and the first draft pays only for what was committed
        since (its last token is fed by the draft itself). The last session's held drafts go: their q-hat
        tables would otherwise stay in the heap until positions of this one overwrite them."""
        Role.begin(self, *args)
        chain = self.chain
        for i in range(len(chain)):
            chain[i] = None
        self._catch_up(self.length - 1)

    def draft(self, committed, gamma):
        """(pos0, tokens, tables): n <= gamma drafts (a block stops after an EOS draft), each table its q-hat as
        messages.pack_table bytes (None when greedy): messages.pack_held_draft's arguments."""
        self._check_session()
        if committed != self.length:
            raise Refused(E_STATE, "draft from %d tokens, but %d are committed here" % (committed, self.length))
        if gamma > MAX_GAMMA:
            raise Refused(E_RANGE, "gamma %d exceeds %d" % (gamma, MAX_GAMMA))
        if committed + gamma > self.max_seq:
            raise Refused(E_RANGE, "drafts up to position %d exceed the context of %d"
                          % (committed + gamma, self.max_seq))
        chain = self.chain
        for p in range(self.held, committed + MAX_GAMMA):  # drafts committed or cut: their tables go now
            chain[p % MAX_GAMMA] = None
        tokens = []
        tables = []
        hits = 0
        for p in range(committed, committed + gamma):
            if p >= self.held:
                self._draft_next()
            else:
                hits += 1
            tokens.append(self.tokens[p])
            tables.append(chain[p % MAX_GAMMA])
            if tokens[-1] == self.eos:
                break
        self.stats["drafted"] += len(tokens)
        self.stats["draft_hits"] += hits
        return committed, tokens, tables

    def _draft_next(self):
        """Sample the draft at position `held` and hold it."""
        p = self.held
        self._catch_up(p - 1)
        logits = self._feed(p - 1, p)
        argmax = self.engine.argmax
        if self.greedy and self.table is not None:  # the table's token where it holds the stream's last tokens
            known = self.table.get(self.tokens, p)
            if known >= 0:
                argmax = lambda: known
        token, ids, weights = rule.draft(self.greedy, argmax, lambda: sampling.draft_table(
            memoryview(logits), 0, self.vocab, self.temp_milli, self.draft_top_k, self.engine.exp_table),
            self.seed, p)
        # its table held as its DRAFT bytes (not two lists), made first: a MemoryError leaves it undrafted
        table = None if self.greedy else pack_table(token, ids, weights)
        self.tokens[p] = token
        self.chain[p % MAX_GAMMA] = table
        self.held = p + 1

    def idle_step(self):
        """Pipelined speculation: draft ahead (assuming every draft is accepted) up to spec_ahead tokens."""
        if (not self.active or self.held >= self.length + self.spec_ahead or self.held >= self.max_seq
                or self.tokens[self.held - 1] == self.eos and self.held > self.length):
            return False
        self._draft_next()
        self.stats["ahead"] += 1
        return True


class Verifier(Role):
    """Checks drafts against the target in one batched pass and applies the shared acceptance rule.

    Drafts may come with partial q-hat tables (each its token's weight only: enough to accept it). At the
    rejection of such a draft the verdict is (n_accepted, rule.PARTIAL): the accepted drafts are committed,
    and the target's table at the rejected position is kept (`pending`) until the host sends that draft
    again with its whole table, which then gets the residual token without a second pass."""

    pending = None  # (position, draft, its q(x), the target's table there, in bufs) after a PARTIAL verdict

    def __init__(self, engine, stats):
        Role.__init__(self, engine, stats)
        # every sampled row's table is built in these, one row at a time (rule.verdict_step): a sampled verify
        # allocates nothing vocabulary-sized, where it took three lists a row and kept a table a row (heap on a C3)
        self.bufs = sampling.buffers(self.vocab)
        self._row = None  # the table last built: a PARTIAL verdict keeps it (pending) until the next verify

    def verify(self, pos0, entries):
        """(pos0, n_accepted, token) for the drafts `entries` [(token, ids, weights)] at pos0.."""
        self._check_session()
        n = len(entries)
        pend = self.pending
        self.pending = None
        if pend is not None and n == 1 and pos0 == pend[0] == self.length:
            return self._residual(pend, entries[0])
        if pos0 != self.length:
            raise Refused(E_STATE, "drafts start at %d, but %d tokens are committed here" % (pos0, self.length))
        if n + 1 > self.max_batch or pos0 + n >= self.max_seq:
            raise Refused(E_RANGE, "%d drafts at %d exceed the context of %d or the batch of %d"
                          % (n, pos0, self.max_seq, self.max_batch))
        drafts = []
        qs = []
        for token, ids, weights in entries:
            self._check_draft(token, ids, weights)
            drafts.append(token)
            qs.append((ids, weights))
        for i in range(n):
            self._put(pos0 + i, drafts[i])
        self._catch_up(pos0 - 1)
        logits = self._feed(pos0 - 1, pos0 + n)

        def table(j):  # asked row by row up to the first rejection: the last one built is the rejected draft's
            self._row = self._table(logits, j)
            return self._row

        acc, tok = rule.verdict_step(self.greedy, self.engine.argmax, table, drafts, qs, self.seed, pos0, self.eos)
        if tok == rule.PARTIAL:  # its table stays in bufs: nothing builds another before the next verify
            self.pending = (pos0 + acc, drafts[acc], qs[acc][1][0], self._row)
        self._row = None
        st = self.stats
        st["verified"] += n
        st["accepted"] += acc
        return self._commit_verdict(pos0, acc, tok)

    def _commit_verdict(self, pos0, acc, tok):
        """The verdict commits itself: the accepted drafts and the emitted token (none after an accepted EOS,
        none yet after a PARTIAL verdict)."""
        self.length = pos0 + acc
        if tok >= 0:
            self._put(self.length, tok)
            self.length += 1
        return pos0, acc, tok

    def _residual(self, pend, entry):
        """The token of a PARTIAL verdict, from the whole table of the rejected draft."""
        p, x, qx, table = pend
        token, ids, weights = entry
        self._check_draft(token, ids, weights)
        if token != x or len(ids) < 2 and weights[0] < rule.ONE or weights[ids.index(x)] != qx:
            raise Refused(E_MESSAGE, "draft %d at %d was rejected with q(x) = %d: send its whole q-hat table"
                          % (x, p, qx))
        return self._commit_verdict(p, 0, rule.sample_residual(table, ids, weights, self.seed, p))

    def _check_draft(self, token, ids, weights):
        vocab = self.vocab
        if token >= vocab:
            raise Refused(E_RANGE, "draft token %d is outside the vocabulary of %d" % (token, vocab))
        if self.greedy:
            return
        total = 0
        has = False
        for j in range(len(ids)):
            if ids[j] >= vocab:
                raise Refused(E_RANGE, "q-hat id %d is outside the vocabulary of %d" % (ids[j], vocab))
            total += weights[j]
            if ids[j] == token:
                has = True
        if not has or total != rule.ONE and (total > rule.ONE or len(ids) > 1):  # whole, or partial: ([x], [q(x)])
            raise Refused(E_MESSAGE, "a q-hat table must sum to %d and contain its draft token" % rule.ONE)
