# Random-interleaving simulation of attention v1's synchronisation: mbarrier phases/parity, the
# two-stage K/V ring, per-warp releases, asynchronous TMA completion, warpgroup-collective wgmma
# with commit/wait groups, and the ping-pong named barriers. Checks: no deadlock, every wgmma reads
# the tile it expects, no TMA write lands in a stage an in-flight wgmma reads, barriers end balanced.
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

def simulate(tiles, seed):
    rnd = random.Random(seed)
    full_q = MBar(1); full_k = [MBar(1) for _ in range(STAGES)]; full_v = [MBar(1) for _ in range(STAGES)]
    empty_k = [MBar(CONSUMERS * WARPS) for _ in range(STAGES)]; empty_v = [MBar(CONSUMERS * WARPS) for _ in range(STAGES)]
    stage_k = [None] * STAGES; stage_v = [None] * STAGES
    sched = [Named(), Named()]
    inflight_tma = []   # (kind, stage, tile, barrier)
    # wgmma ops per consumer WG: list of dicts {reads:[(kind,stage,tile)], issued:set(warps), done}
    wg_ops = [[] for _ in range(CONSUMERS)]
    warp_groups = [[[] for _ in range(WARPS)] for _ in range(CONSUMERS)]  # per warp: list of committed groups (op indices)
    errors = []

    def tma(kind, stage, tile, bar):
        inflight_tma.append((kind, stage, tile, bar))
        (stage_k if kind == 'k' else stage_v)[stage] = ('writing', tile)

    def producer():
        yield from wait(lambda: True)
        full_q.expect_tx(2); inflight_tma.append(('q', 0, 0, full_q)); inflight_tma.append(('q', 0, 0, full_q))
        for t in range(tiles):
            st, par = t % STAGES, (t // STAGES) & 1
            yield from wait(lambda: empty_k[st].ready(par ^ 1))
            full_k[st].expect_tx(2); tma('k', st, t, full_k[st]); inflight_tma.append(('k2', st, t, full_k[st]))
            yield from wait(lambda: empty_v[st].ready(par ^ 1))
            full_v[st].expect_tx(2); tma('v', st, t, full_v[st]); inflight_tma.append(('v2', st, t, full_v[st]))

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
        def end_slot(slot):
            if c == 0 or slot + 1 < tiles: other.add(me)
        # every warp of consumer 1 pre-arrives on consumer 0's barrier
        if c == 1: other.add(me)
        yield from wait(lambda: full_q.ready(0))
        yield from wait(lambda: full_k[0].ready(0))
        yield from nsync(mine)
        issue([('k', 0, 0)]); end_slot(0)
        yield from wgwait(0)
        empty_k[0].arrive()
        for t in range(1, tiles):
            st, pst = t % STAGES, (t - 1) % STAGES
            yield from wait(lambda: full_k[st].ready((t // STAGES) & 1))
            yield from wait(lambda: full_v[pst].ready(((t - 1) // STAGES) & 1))
            yield from nsync(mine)
            issue([('k', st, t)]); issue([('v', pst, t - 1)]); end_slot(t)
            yield from wgwait(1)
            empty_k[st].arrive()
            yield from wgwait(0)
            empty_v[pst].arrive()
        last = tiles - 1
        yield from wait(lambda: full_v[last % STAGES].ready((last // STAGES) & 1))
        issue([('v', last % STAGES, last)])
        yield from wgwait(0)

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
            kind, st, tile, bar = inflight_tma.pop(rnd.randrange(len(inflight_tma)))
            if kind in ('k', 'v'):
                for c in range(CONSUMERS):
                    for op in wg_ops[c]:
                        if not op['done'] and op['issued'] and any(r[0] == kind and r[1] == st for r in op['reads']):
                            errors.append(f"TMA {kind}{tile} lands in stage {st} under an in-flight wgmma {op['reads']}")
                (stage_k if kind == 'k' else stage_v)[st] = ('ready', tile)
            bar.complete_tx(1)
            stuck = 0
        elif isinstance(e, tuple) and e[0] == 'op':
            _, c, i = e; op = wg_ops[c][i]
            for kind, st, tile in op['reads']:
                have = (stage_k if kind == 'k' else stage_v)[st]
                if have != ('ready', tile): errors.append(f"WG{c} reads {kind}{tile} from stage {st} holding {have}")
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
for tiles in (1, 2, 3, 4, 7):
    for seed in range(300):
        errs = simulate(tiles, seed)
        if errs:
            bad += 1
            if bad < 5: print(tiles, seed, errs[:3])
print("runs with errors:", bad)
sys.exit(1 if bad else 0)
