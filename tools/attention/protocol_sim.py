# Random-interleaving simulation of attention v1's and v2's synchronisation: mbarrier phases/parity,
# the two-stage K/V ring, per-warp releases, asynchronous TMA completion (each box on its own),
# warpgroup-collective wgmma with commit/wait groups, and the ping-pong named barriers. v2 adds the
# persistent loop: several items per CTA, the ring and the issue slots carried across items, Q
# reloaded per item behind an empty barrier that each consumer warp releases after its item's last
# Q·Kᵀ, and the last V stage of each item released. Checks: no deadlock, every wgmma reads the Q /
# K / V it expects, no TMA write lands in a buffer an in-flight wgmma reads, barriers end balanced.
# Run: python3 tools/attention/protocol_sim.py (prints the number of failing runs; 0 expected).
import random
import sys

STAGES, CONSUMERS, WARPS = 2, 2, 4

class MBar:
    def __init__(s, count): s.count, s.pending, s.tx, s.phase = count, count, 0, 0
    def arrive(s):
        s.pending -= 1; assert s.pending >= 0, "over-arrival"; s._check()
    def expect_tx(s, b): s.tx += b; s.arrive()
    def complete_tx(s, b): s.tx -= b; assert s.tx >= 0; s._check()
    def _check(s):
        if s.pending == 0 and s.tx == 0: s.phase += 1; s.pending = s.count
    def ready(s, parity): return (s.phase & 1) != parity

class Named:
    def __init__(s): s.arrived, s.gen, s.by = 0, 0, {}
    def add(s, who):
        s.arrived += 32; s.by[who] = s.by.get(who, 0) + 32
        assert s.arrived <= 256, "named barrier over-arrival"
        if s.arrived == 256:
            assert all(v == 128 for v in s.by.values()) and len(s.by) == 2, ("mixed generations", s.by)
            s.arrived, s.by, s.gen = 0, {}, s.gen + 1

def simulate(tiles, seed, items=1, v2=False):
    rnd = random.Random(seed)
    full_q = MBar(1); empty_q = MBar(CONSUMERS * WARPS)
    full_k = [MBar(1) for _ in range(STAGES)]; full_v = [MBar(1) for _ in range(STAGES)]
    empty_k = [MBar(CONSUMERS * WARPS) for _ in range(STAGES)]; empty_v = [MBar(CONSUMERS * WARPS) for _ in range(STAGES)]
    # buffer state per (kind, stage): [tag of the latest load, boxes still in flight]
    state = {('q', 0): [None, 0]}
    for st in range(STAGES): state[('k', st)] = [None, 0]; state[('v', st)] = [None, 0]
    sched = [Named(), Named()]
    inflight_tma = []   # (kind, stage, tag, barrier), one per 64-channel box
    # wgmma ops per consumer WG: list of dicts {reads:[(kind,stage,tag)], issued:set(warps), done}
    wg_ops = [[] for _ in range(CONSUMERS)]
    warp_groups = [[[] for _ in range(WARPS)] for _ in range(CONSUMERS)]  # per warp: committed groups (op indices)
    errors = []

    def tma(kind, stage, tag, bar):  # two boxes (column halves), landing independently
        bar.expect_tx(2)
        state[(kind, stage)] = [tag, 2]
        inflight_tma.append((kind, stage, tag, bar)); inflight_tma.append((kind, stage, tag, bar))

    def producer():
        yield from wait(lambda: True)
        ring = 0
        for n in range(items):
            if v2: yield from wait(lambda: empty_q.ready((n & 1) ^ 1))
            tma('q', 0, n, full_q)
            for t in range(tiles):
                st, par = ring % STAGES, (ring // STAGES) & 1
                yield from wait(lambda: empty_k[st].ready(par ^ 1))
                tma('k', st, ring, full_k[st])
                yield from wait(lambda: empty_v[st].ready(par ^ 1))
                tma('v', st, ring, full_v[st])
                ring += 1

    def wait(cond):
        while not cond(): yield 'blocked'
        yield 'ran'

    def consumer(c, w):
        mine, other = sched[c], sched[1 - c]
        me = ('wg', c)
        def nsync(bar):
            g = bar.gen; bar.add(me)
            yield from wait(lambda: bar.gen > g)
        def issue(reads):
            # the warps of a warpgroup issue the same sequence of commit groups
            idx = len(warp_groups[c][w])
            ops = wg_ops[c]
            if idx == len(ops): ops.append({'reads': reads, 'issued': set(), 'done': False})
            op = ops[idx]; assert op['reads'] == reads
            op['issued'].add(w); warp_groups[c][w].append(idx)
        def wgwait(n):
            grp = warp_groups[c][w]
            yield from wait(lambda: all(wg_ops[c][i]['done'] for i in grp[:len(grp) - n]))
        # every warp of consumer 1 pre-arrives on consumer 0's barrier
        if c == 1: other.add(me)
        ring = 0
        for n in range(items):
            last_item = n + 1 == items
            def end_slot(slot):
                if c == 0 or not last_item or slot + 1 < tiles: other.add(me)
            def after_qk(t):
                empty_k[(ring + t) % STAGES].arrive()
                if v2 and t + 1 == tiles: empty_q.arrive()
            yield from wait(lambda: full_q.ready(n & 1))
            yield from wait(lambda: full_k[ring % STAGES].ready((ring // STAGES) & 1))
            yield from nsync(mine)
            issue([('q', 0, n), ('k', ring % STAGES, ring)]); end_slot(0)
            yield from wgwait(0)
            after_qk(0)
            for t in range(1, tiles):
                cur, prev = ring + t, ring + t - 1
                st, pst = cur % STAGES, prev % STAGES
                yield from wait(lambda: full_k[st].ready((cur // STAGES) & 1))
                yield from wait(lambda: full_v[pst].ready((prev // STAGES) & 1))
                yield from nsync(mine)
                issue([('q', 0, n), ('k', st, cur)]); issue([('v', pst, prev)]); end_slot(t)
                yield from wgwait(1)
                after_qk(t)
                yield from wgwait(0)
                empty_v[pst].arrive()
            last = ring + tiles - 1
            yield from wait(lambda: full_v[last % STAGES].ready((last // STAGES) & 1))
            issue([('v', last % STAGES, last)])
            yield from wgwait(0)
            if v2: empty_v[last % STAGES].arrive()
            ring += tiles

    actors = [('P', producer())] + [((c, w), consumer(c, w)) for c in range(CONSUMERS) for w in range(WARPS)]
    alive = dict(actors)
    stuck = 0
    while alive or inflight_tma or any(not op['done'] for ops in wg_ops for op in ops):
        events = list(alive.keys()) + (['tma'] if inflight_tma else []) + \
                 [('op', c, i) for c in range(CONSUMERS) for i, op in enumerate(wg_ops[c])
                  if not op['done'] and len(op['issued']) == WARPS and all(wg_ops[c][j]['done'] for j in range(i))]
        if not events: break
        e = rnd.choice(events)
        if e == 'tma':
            kind, st, tag, bar = inflight_tma.pop(rnd.randrange(len(inflight_tma)))
            for c in range(CONSUMERS):
                for op in wg_ops[c]:
                    if not op['done'] and op['issued'] and any(r[0] == kind and r[1] == st for r in op['reads']):
                        errors.append(f"TMA {kind}{tag} lands in stage {st} under an in-flight wgmma {op['reads']}")
            state[(kind, st)][1] -= 1
            bar.complete_tx(1)
            stuck = 0
        elif isinstance(e, tuple) and e[0] == 'op':
            _, c, i = e; op = wg_ops[c][i]
            for kind, st, tag in op['reads']:
                have = state[(kind, st)]
                if have != [tag, 0]: errors.append(f"WG{c} reads {kind}{tag} from stage {st} holding {have}")
            op['done'] = True; stuck = 0
        else:
            try:
                r = next(alive[e])
                stuck = 0 if r == 'ran' else stuck + 1
            except StopIteration:
                del alive[e]; stuck = 0
        if stuck > 10000:
            return [f"deadlock: alive {list(alive)}"]
    if alive: errors.append(f"deadlock at end: {list(alive)}")
    for i, b in enumerate(sched):
        if b.arrived: errors.append(f"schedule barrier {i} left with {b.arrived} arrivals")
    return errors

bad = 0
runs = 0
for tiles in (1, 2, 3, 4, 7):
    for seed in range(300):
        runs += 1
        errs = simulate(tiles, seed)
        if errs:
            bad += 1
            if bad < 5: print('v1', tiles, seed, errs[:3])
for items in (1, 2, 3, 5):
    for tiles in (1, 2, 3, 4, 5):
        for seed in range(120):
            runs += 1
            errs = simulate(tiles, seed, items=items, v2=True)
            if errs:
                bad += 1
                if bad < 5: print('v2', items, tiles, seed, errs[:3])
print("runs:", runs, "runs with errors:", bad)
sys.exit(1 if bad else 0)
