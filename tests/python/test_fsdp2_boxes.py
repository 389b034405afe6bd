"""FSDP2 as it is: the boxes of DTensor shards over 1-D meshes (fully_shard: Shard(0)) and 2-D
meshes (HSDP: (Replicate(), Shard(0)); also nested Shard(0) x Shard(0) and Shard(0) x Shard(1)),
checked against torch.chunk's rule written here another way (the row indices each chunk holds,
chunk after chunk), with uneven dims and empty last shards; then a group: four HSDP senders
(2 replicas x 2 shards) and three FSDP2 senders with an empty last shard push two versions into
one receiver, which holds every byte of the whole params, with no layout argument."""
from __future__ import annotations

import array
import itertools
import threading
import unittest

import wsync
import wsync_testlib as tl
from wsync.tensors import dtensor_box


class FakeMesh2:
    """A DeviceMesh look-alike of any number of dims (shape, size(dim), get_coordinate())."""

    def __init__(self, shape, coordinate):
        self.shape = tuple(shape)
        self.ndim = len(self.shape)
        self._coord = list(coordinate)

    def size(self, dim=None):
        if dim is None:
            n = 1
            for s in self.shape:
                n *= s
            return n
        return self.shape[dim]

    def get_coordinate(self):
        return self._coord


class FakeDT:
    """A DTensor look-alike: global shape, placements (one per mesh dim), the local tensor."""

    def __init__(self, local, global_shape, placements, mesh):
        self._local = local
        self.shape = tuple(global_shape)
        self.placements = tuple(placements)
        self.device_mesh = mesh
        self.dtype = local.dtype

    def to_local(self):
        return self._local


class _StridedShard(tl.Shard):
    """FSDP2's placement over a TP-sharded dim: not one box."""

    def __init__(self, dim, split_factor):
        super().__init__(dim)
        self.split_factor = split_factor


def chunk_indices(indices, m):
    """torch.chunk(indices, m) as lists, padded with empty chunks to m (what FSDP2's
    _chunk_with_empty does): chunks of ceil(len / m) taken in order until none is left."""
    c = -(-len(indices) // m) if indices else 0
    out = []
    for k in range(m):
        out.append(indices[k * c:(k + 1) * c] if c else [])
    return out


def expected_box(shape, placements, mesh_shape, coord):
    """The box of a coordinate as the index sets each dim keeps after every placement's chunk,
    mesh dim after mesh dim; (start, len) from the first index and the count."""
    keep = [list(range(n)) for n in shape]
    for i, p in enumerate(placements):
        if p.is_shard():
            d = p.dim % len(shape)
            keep[d] = chunk_indices(keep[d], mesh_shape[i])[coord[i]]
    start = tuple(k[0] if k else None for k in keep)
    length = tuple(len(k) for k in keep)
    for k in keep:   # every dim's kept indices are one run
        if k:
            assert k == list(range(k[0], k[0] + len(k)))
    return start, length


def fake_local(length):
    n = 1
    for s in length:
        n *= s
    return tl.FakeTensor(bytearray(2 * n), "torch.bfloat16", length)


class Boxes(unittest.TestCase):
    def check(self, shape, placements, mesh_shape):
        """Every coordinate's box equals the chunk rule's; the boxes of one replica group tile
        the tensor exactly (each element once)."""
        coords = list(itertools.product(*(range(m) for m in mesh_shape)))
        seen = {}
        for coord in coords:
            want_start, want_len = expected_box(shape, placements, mesh_shape, coord)
            dt = FakeDT(fake_local(want_len), shape, placements, FakeMesh2(mesh_shape, coord))
            gshape, start, length = dtensor_box(dt)
            self.assertEqual(gshape, tuple(shape))
            self.assertEqual(length, want_len, f"{shape} {placements} {mesh_shape} {coord}")
            for d in range(len(shape)):
                if want_len[d]:
                    self.assertEqual(start[d], want_start[d], f"{coord} dim {d}")
                # an empty box starts inside [0, n]
                self.assertTrue(0 <= start[d] <= shape[d])
            replica = tuple(c for c, p in zip(coord, placements) if p.is_replicate())
            cells = seen.setdefault(replica, {})
            for idx in itertools.product(*(range(s, s + n) for s, n in zip(start, length))):
                self.assertNotIn(idx, cells, f"{coord}: {idx} twice")
                cells[idx] = coord
        total = 1
        for s in shape:
            total *= s
        for replica, cells in seen.items():
            self.assertEqual(len(cells), total, f"replica group {replica}")
        return seen

    def test_fsdp2_1d_uneven_and_empty(self):
        for n in (1, 2, 3, 4, 5, 7, 9, 384):
            for world in (1, 2, 3, 4, 8):
                self.check((n, 3), (tl.Shard(0),), (world,))
                self.check((n,), (tl.Shard(0),), (world,))
        # world 4, 5 rows: chunks of 2 -> 2, 2, 1, 0 (the last rank holds nothing)
        dt = FakeDT(fake_local((0, 3)), (5, 3), (tl.Shard(0),), FakeMesh2((4,), (3,)))
        self.assertEqual(dtensor_box(dt)[2], (0, 3))
        # world 4, 9 rows: chunks of 3 -> 3, 3, 3, 0 (not 3, 2, 2, 2)
        lens = [dtensor_box(FakeDT(fake_local((n, 3)), (9, 3), (tl.Shard(0),),
                                   FakeMesh2((4,), (k,))))[2][0]
                for k, n in enumerate((3, 3, 3, 0))]
        self.assertEqual(lens, [3, 3, 3, 0])

    def test_hsdp_2d(self):
        for n in (1, 3, 5, 8, 384):
            for mesh in ((2, 2), (2, 3), (3, 4), (1, 2), (2, 1)):
                seen = self.check((n, 4), (tl.Replicate(), tl.Shard(0)), mesh)
                # every replica group holds the same boxes: the same full copy
                self.assertEqual(len(seen), mesh[0])
                per_group = [sorted(set(c[1] for c in cells.values())) for cells in
                             seen.values()]
                self.assertTrue(all(g == per_group[0] for g in per_group))
        # replicas describe equal boxes
        a = dtensor_box(FakeDT(fake_local((3, 4)), (5, 4), (tl.Replicate(), tl.Shard(0)),
                               FakeMesh2((2, 2), (0, 0))))
        b = dtensor_box(FakeDT(fake_local((3, 4)), (5, 4), (tl.Replicate(), tl.Shard(0)),
                               FakeMesh2((2, 2), (1, 0))))
        self.assertEqual(a, b)
        self.assertEqual(a, ((5, 4), (0, 0), (3, 4)))

    def test_nested_and_two_dims(self):
        for n, m in ((5, 7), (9, 2), (1, 1), (16, 16)):
            for mesh in ((2, 2), (2, 3), (3, 2)):
                self.check((n, m), (tl.Shard(0), tl.Shard(0)), mesh)
                self.check((n, m), (tl.Shard(0), tl.Shard(1)), mesh)
                self.check((n, m), (tl.Shard(1), tl.Replicate()), mesh)
        # Shard(0) twice over (2, 2) on 7 rows: [0,4) then [0,2),[2,4); [4,7) then [4,6),[6,7)
        got = [dtensor_box(FakeDT(fake_local((1, 1)), (7, 1), (tl.Shard(0), tl.Shard(0)),
                                  FakeMesh2((2, 2), c)))[1:] for c in
               ((0, 0), (0, 1), (1, 0), (1, 1))]
        self.assertEqual(got, [((0, 0), (2, 1)), ((2, 0), (2, 1)), ((4, 0), (2, 1)),
                               ((6, 0), (1, 1))])

    def test_refused(self):
        local = fake_local((2, 2))
        cases = [
            ((tl.Partial(),), (2,), (0,), "Partial"),
            ((tl.Replicate(), tl.Partial()), (2, 2), (0, 0), "mesh dim 1"),
            ((_StridedShard(0, 2),), (2,), (0,), "strided"),
            ((tl.Shard(0),), (2, 2), (0, 0), "1 placements"),
            ((tl.Shard(2),), (2,), (0,), "dim 2 of a 2-D tensor"),
        ]
        for placements, mesh, coord, text in cases:
            with self.assertRaises(wsync.InvalidArgumentError) as cm:
                dtensor_box(FakeDT(local, (2, 2), placements, FakeMesh2(mesh, coord)))
            self.assertIn(text, cm.exception.message, placements)
        # a non-default shard order (newer torch's DTensorSpec.shard_order) is refused
        class Entry:
            tensor_dim, mesh_dims = 0, (1, 0)

        class Spec:
            shard_order = (Entry(),)
        rev = FakeDT(local, (4, 2), (tl.Shard(0), tl.Shard(0)), FakeMesh2((2, 2), (0, 0)))
        rev._spec = Spec()
        with self.assertRaises(wsync.InvalidArgumentError) as cm:
            dtensor_box(rev)
        self.assertIn("mesh dims [1, 0]", cm.exception.message)
        Entry.mesh_dims = (0, 1)   # the default order is taken
        self.assertEqual(dtensor_box(rev), ((4, 2), (0, 0), (1, 2)))
        off = FakeMesh2((2, 2), (0, 0))
        off._coord = None          # a process outside the mesh
        with self.assertRaises(wsync.InvalidArgumentError) as cm:
            dtensor_box(FakeDT(local, (2, 2), (tl.Replicate(), tl.Shard(0)), off))
        self.assertIn("not part of its device mesh", cm.exception.message)
        # the local tensor must be the box: FSDP2's padded storage is not what to_local() gives
        with wsync.Sender("127.0.0.1:0", rank=0, world=1, receivers=1,
                          timeout_ms=tl.TIMEOUT_MS) as s:
            padded = FakeDT(fake_local((3, 2)), (5, 2), (tl.Shard(0),), FakeMesh2((2,), (1,)))
            with self.assertRaises(wsync.InvalidArgumentError) as cm:
                s.add_state_dict({"w": padded})
            self.assertIn("'w'", cm.exception.message)
            self.assertIn("[3, 2]", cm.exception.message)
            self.assertIn("[2, 2]", cm.exception.message)


# ---------------------------------------------------------------------------------------------
# A group: senders describe FSDP2 / HSDP state dicts with no layout argument
# ---------------------------------------------------------------------------------------------

PARAMS = {"a.weight": (5, 3), "b.weight": (1, 4), "c.bias": (7,), "d.weight": (9, 2)}


def value(v, name, flat):
    return float(v * 10000 + list(PARAMS).index(name) * 1000 + flat)


def whole(v, name):
    n = 1
    for s in PARAMS[name]:
        n *= s
    return [value(v, name, i) for i in range(n)]


class Group(unittest.TestCase):
    def run_group(self, mesh_shape, placements):
        coords = list(itertools.product(*(range(m) for m in mesh_shape)))
        world = len(coords)
        senders = [wsync.Sender("127.0.0.1:0", rank=0, world=world, receivers=1,
                                timeout_ms=tl.TIMEOUT_MS)]
        for r in range(1, world):
            senders.append(wsync.Sender(senders[0].coordinator, rank=r, world=world,
                                        receivers=1, timeout_ms=tl.TIMEOUT_MS))
        # each rank's local shards: its rows of the whole tensors, by the chunk rule
        bufs = [{name: array.array("f") for name in PARAMS} for _ in coords]
        boxes = [{name: expected_box(shape, placements, mesh_shape, coord)
                  for name, shape in PARAMS.items()} for coord in coords]

        def fill(r, v):
            for name, shape in PARAMS.items():
                start, length = boxes[r][name]
                cols = shape[1] if len(shape) == 2 else 1
                rows = [] if length[0] == 0 else \
                    whole(v, name)[start[0] * cols:(start[0] + length[0]) * cols]
                buf = bufs[r][name]
                if len(buf) == 0:
                    buf.extend(rows)         # before the sender holds it
                else:
                    for i, x in enumerate(rows):
                        buf[i] = x           # in place: the sender reads this memory
        for r, coord in enumerate(coords):
            fill(r, 1)
            sd = {name: FakeDT(wsync.HostTensor(bufs[r][name], "f32", boxes[r][name][1]), shape,
                               placements, FakeMesh2(mesh_shape, coord))
                  for name, shape in PARAMS.items()}
            specs = senders[r].add_state_dict(sd)        # no layout argument
            self.assertEqual([sp.box.len for sp in specs], [boxes[r][n][1] for n in PARAMS])
            for sp, n in zip(specs, PARAMS):
                if 0 not in sp.box.len:
                    self.assertEqual(sp.box.start, boxes[r][n][0])
        rv = wsync.Receiver(senders[0].coordinator, rank=0, receivers=1,
                            timeout_ms=tl.TIMEOUT_MS)
        targets = {}
        for name, shape in PARAMS.items():
            targets[name] = bytearray(4 * len(whole(1, name)))
            rv.add_target(wsync.replicated(wsync.Param(name, "f32", shape)), targets[name])
        errors = []
        go2 = threading.Event()

        def push(r, s):
            try:
                s.push(1)
                go2.wait(60)
                fill(r, 2)            # the optimizer step, in place
                s.push(2)
            except BaseException as e:
                errors.append((r, repr(e)))
        threads = [threading.Thread(target=push, args=(r, s)) for r, s in enumerate(senders)]
        for t in threads:
            t.start()
        try:
            for v in (1, 2):
                if v == 2:
                    go2.set()
                self.assertEqual(rv.wait(), v, errors)
                for name in PARAMS:
                    got = array.array("f")
                    got.frombytes(bytes(targets[name]))
                    self.assertEqual(got.tolist(), whole(v, name), f"version {v}: {name}")
        finally:
            go2.set()
            if errors or any(t.is_alive() for t in threads):
                rv.close()
            for t in threads:
                t.join(60)
        self.assertEqual(errors, [])
        rv.close()
        for s in reversed(senders):
            s.close()
        return boxes

    def test_fsdp2_three_ranks_empty_last_shard(self):
        boxes = self.run_group((3,), (tl.Shard(0),))
        self.assertEqual(boxes[2]["b.weight"][1], (0, 4))      # 1 row over 3 ranks
        self.assertEqual(boxes[2]["a.weight"][1], (1, 3))      # 5 rows: 2, 2, 1
        self.assertEqual(boxes[2]["d.weight"][1], (3, 2))      # 9 rows: 3, 3, 3

    def test_hsdp_two_replicas_of_two_shards(self):
        boxes = self.run_group((2, 2), (tl.Replicate(), tl.Shard(0)))
        self.assertEqual(boxes[0], boxes[2])                   # replicas: the same boxes
        self.assertEqual(boxes[1]["b.weight"][1], (0, 4))


if __name__ == "__main__":
    unittest.main()
