"""The on-disk format: WebDataset tar shards of sample blocks, the manifest, and the shard permutation.

A shard is a plain tar (WebDataset layout): member `NNNNNN.samples.npz` holds a block of up to
`samples_per_block` consecutive samples as a compressed numpy `.npz` of the `Samples` columns (uint16 token
ids). Packing many samples per member is what makes ~200 bytes per length-128 instance possible (a tar
header alone is 512 bytes). Nothing is pickled: `np.load(..., allow_pickle=False)` reads it, and every byte
is deterministic (fixed zip/tar timestamps, owners and modes).

`manifest.json` is written last; its presence means the directory is complete. It lists every shard's
blocks as (byte offset, size, sha256 of the block's bytes truncated to 128 bits): a reader of a shard in an
object store fetches one block with one ranged GET and checks it, without reading tar headers first.
The directory may be a local path or an object-store URL (`bertdist.storage`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import struct
import tarfile
import zlib
from typing import Any, Iterator

import numpy as np

from bertdist import storage
from bertdist.config.choices import choices
from bertdist.config.schema import MaskingConfig
from bertdist.data.instances import InstanceOptions
from bertdist.data.samples import Samples
from bertdist.errors import DataError

FORMAT_VERSION = 2
MANIFEST = "manifest.json"
SAMPLES_PER_BLOCK = 512
_ZIP_DATE = (0 << 9) | (1 << 5) | 1
"""1980-01-01 as an MS-DOS date, the earliest a zip can hold: no wall-clock time in the bytes."""


def shard_name(index: int) -> str:
    return f"shard-{index:06d}.tar"


def encode_block(samples: Samples) -> bytes:
    """The block as a `.npz` (a zip of `.npy` files), compressed with Huffman coding only.

    Token ids hardly ever repeat as byte strings, so deflate's match search (zipfile's only mode) costs
    time and finds little: Huffman-only deflate is twice as fast and slightly smaller here
    (benchmarks/prepare_throughput.py). zipfile cannot set a deflate strategy, so the zip is written here;
    it is a plain zip that `np.load` (and any unzip) reads."""
    members = []
    for name in Samples.column_names():
        array_buf = io.BytesIO()
        np.lib.format.write_array(array_buf, np.ascontiguousarray(getattr(samples, name)), allow_pickle=False)
        raw = array_buf.getvalue()
        deflate = zlib.compressobj(1, zlib.DEFLATED, -15, 9, zlib.Z_HUFFMAN_ONLY)  # any level > 0: Huffman only
        members.append((f"{name}.npy".encode(), raw, deflate.compress(raw) + deflate.flush()))
    return _zip(members)


def _zip(members: list[tuple[bytes, bytes, bytes]]) -> bytes:
    """A zip archive of (name, data, raw-deflated data) members, with fixed timestamps (deterministic bytes)."""
    out, central = io.BytesIO(), io.BytesIO()
    for name, raw, packed in members:
        offset = out.tell()
        # version 2.0, no flags, deflate, 1980-01-01 00:00, crc, sizes, name length, no extra field
        common = struct.pack("<HHHHHIIIH", 20, 0, 8, 0, _ZIP_DATE, zlib.crc32(raw), len(packed), len(raw), len(name))
        out.write(b"PK\x03\x04" + common + struct.pack("<H", 0) + name + packed)
        # made by unix 2.0, then as above; no extra/comment, disk 0, internal 0, external 0o644, offset
        central.write(
            b"PK\x01\x02"
            + struct.pack("<H", 0x0314)
            + common
            + struct.pack("<HHHHII", 0, 0, 0, 0, 0o644 << 16, offset)
            + name
        )
    directory = central.getvalue()
    out.write(directory)
    out.write(
        b"PK\x05\x06"
        + struct.pack("<HHHHIIH", 0, 0, len(members), len(members), len(directory), out.tell() - len(directory), 0)
    )
    return out.getvalue()


def decode_block(data: bytes, where: str) -> Samples:
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            return Samples(**{name: npz[name] for name in Samples.column_names()})
    except Exception as e:  # noqa: BLE001  untrusted bytes: numpy's header parser alone raises SyntaxError,
        # tokenize.TokenError, ValueError...; whatever a damaged block makes a parser raise means "corrupt"
        raise DataError(f"{where}: corrupt sample block ({type(e).__name__}: {str(e)[:200]})") from None


def write_shard(path: str, samples: Samples, samples_per_block: int) -> tuple[str, list[list]]:
    """Write atomically (`bertdist.storage.atomic_write`); returns the sha256 of the bytes written and the
    blocks as [offset, size, block_digest] (each member's data follows its one 512-byte USTAR header)."""
    digest = hashlib.sha256()
    blocks = []
    with storage.atomic_write(path, "wb") as raw:
        writer = _HashingWriter(raw, digest)
        with tarfile.open(fileobj=writer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            for b, lo in enumerate(range(0, len(samples), samples_per_block)):
                data = encode_block(samples.slice(lo, min(lo + samples_per_block, len(samples))))
                info = tarfile.TarInfo(f"{b:06d}.samples.npz")
                info.size, info.mtime, info.mode = len(data), 0, 0o644
                blocks.append([tar.offset + tarfile.BLOCKSIZE, len(data), block_digest(data)])
                tar.addfile(info, io.BytesIO(data))
    return digest.hexdigest(), blocks


def block_digest(data: bytes) -> str:
    """sha256 of a block's bytes, its first 128 bits in hex: ample against corruption and replaced objects,
    and half the manifest size of the full digest (a manifest lists every block of the corpus)."""
    return hashlib.sha256(data).hexdigest()[:32]


class _HashingWriter:
    def __init__(self, raw: io.BufferedWriter, digest: "hashlib._Hash"):
        self.raw, self.digest = raw, digest

    def write(self, data: bytes) -> int:
        self.digest.update(data)
        return self.raw.write(data)

    def tell(self) -> int:
        return self.raw.tell()


def block_locations(path: str) -> list[tuple[int, int]]:
    """(byte offset, size) of each block's data in a local shard, in order, from its tar headers."""
    try:
        with tarfile.open(path, "r:") as tar:
            return [(m.offset_data, m.size) for m in tar.getmembers() if m.name.endswith(".samples.npz")]
    except (OSError, tarfile.TarError) as e:
        raise DataError(f"{path}: unreadable shard ({e})") from None


def read_block(
    path: str, location: tuple[int, int], expected_samples: int | None = None, data: bytes | None = None
) -> Samples:
    """The block at `location` of a shard, read from `path` or given as its bytes (`data`)."""
    offset, size = location
    if data is None:
        data = storage.read_bytes(path, offset, offset + size)
    if len(data) != size:
        raise DataError(f"{path}: truncated shard (block at byte {offset})")
    samples = decode_block(data, path)
    if expected_samples is not None and len(samples) != expected_samples:
        raise DataError(
            f"{path}: the block at byte {offset} holds {len(samples)} samples, the manifest implies "
            f"{expected_samples} (edited manifest or replaced shard)"
        )
    return samples


def shard_blocks(shard_dir: str, manifest: dict) -> dict[str, list[tuple[int, int, int]]]:
    """Every shard checked against the manifest, cheaply (no decoding): it exists, has the recorded size, and
    its blocks are the ones its sample count needs. Returns {shard: [(offset, size, samples)]}.

    Shards in a store are checked against the manifest's block list (one listing of the directory, no read
    of any shard; each block's digest is checked when it is fetched). Local shards are also checked against
    their tar headers, which is what a manifest without a block list (bertdist before 0.2) relies on. A
    flipped byte in a tar header or a shard cut at a member boundary would otherwise end the shard early
    without an error; here it is a DataError naming the file before training starts. The content of the
    blocks is verified by checksum only with `verify_checksums`, or block by block by a streaming reader.
    """
    per_block = manifest["options"]["samples_per_block"]
    out, problems = {}, []
    sizes = storage.sizes(shard_dir)
    for shard in manifest["shards"]:
        path = storage.join(shard_dir, shard["name"])
        if shard["name"] not in sizes:
            problems.append(f"{path}: listed in the manifest but missing")
            continue
        if sizes[shard["name"]] != shard["bytes"]:
            problems.append(
                f"{path}: {sizes[shard['name']]:,} bytes, the manifest says {shard['bytes']:,} "
                "(truncated or replaced shard)"
            )
            continue
        n = shard["num_samples"]
        counts = [min(per_block, n - lo) for lo in range(0, n, per_block)]
        listed = [(o, s) for o, s, _ in shard["blocks"]] if "blocks" in shard else None
        try:  # a local shard's tar headers are read too (cheap there): a damaged one is reported, not read past
            locations = listed if listed is not None and storage.is_url(path) else block_locations(path)
        except DataError as e:
            problems.append(str(e))
            continue
        if listed is not None and len(locations) == len(listed) and locations != listed:
            problems.append(
                f"{path}: its tar headers place the blocks elsewhere than the manifest says (edited manifest?)"
            )
            continue
        if len(locations) != len(counts):
            problems.append(
                f"{path}: {len(locations)} sample blocks, the manifest's {n} samples need {len(counts)} "
                "(damaged tar header, or an edited manifest)"
            )
            continue
        out[shard["name"]] = [(offset, size, count) for (offset, size), count in zip(locations, counts)]
    if problems:
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise DataError("; ".join(problems[:5]) + more)
    return out


def write_manifest(shard_dir: str, manifest: dict) -> None:
    """Indented for reading, except that each shard (with its block list) is one compact line: a corpus of
    Wikipedia's size has ~10^6 blocks, and indenting each of their numbers would triple the file."""
    head = json.dumps({k: v for k, v in manifest.items() if k != "shards"}, indent=2)
    shards = ",\n".join("    " + json.dumps(s, separators=(",", ":")) for s in manifest["shards"])
    storage.write_text(
        storage.join(shard_dir, MANIFEST), head[: -len("\n}")] + ',\n  "shards": [\n' + shards + "\n  ]\n}\n"
    )


RENAMED_OPTIONS = {"objective": "samples"}
"""Options that earlier bertdist versions wrote into manifests under another name -> the name now. `prepare
--objective` became `--samples`: the word meant the training config's `model.objective` too, another thing."""


def upgrade_options(options: dict) -> dict:
    """A manifest's options as this bertdist names them, so that a directory prepared by an earlier version loads
    and inspects as before: renamed options (RENAMED_OPTIONS) under their names now, and `samples` in a manifest
    older than the option (`nsp`, BERT's pairs, all that prepare made then)."""
    upgraded = {RENAMED_OPTIONS.get(name, name): value for name, value in options.items()}
    upgraded.setdefault("samples", "nsp")
    return upgraded


def earlier_names(options: dict) -> dict:
    """`options` under the names they had when first written: what prepare's fingerprint hashes, so that an
    option's new name neither leaves an unfinished run of an earlier version unresumable nor gives its finished
    directory another fingerprint."""
    earlier = {now: before for before, now in RENAMED_OPTIONS.items()}
    return {earlier.get(name, name): value for name, value in options.items()}


def read_manifest(shard_dir: str) -> dict:
    """The manifest of `shard_dir`, checked, its options upgraded (upgrade_options)."""
    path = storage.join(shard_dir, MANIFEST)
    if not storage.is_file(path):
        raise DataError(f"{shard_dir}: no {MANIFEST}; not a directory written by `bertdist prepare` (or unfinished)")
    try:
        manifest = storage.read_json(path)
    except (OSError, ValueError) as e:
        raise DataError(f"{path}: unreadable manifest ({e})") from None
    if not isinstance(manifest, dict):
        raise DataError(f"{path}: the manifest is a JSON {type(manifest).__name__}, not an object")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise DataError(
            f"{path}: format_version {manifest.get('format_version')!r}, this bertdist reads {FORMAT_VERSION}"
        )
    if not manifest.get("shards"):
        raise DataError(f"{path}: the manifest lists no shards")
    problem = _shape_problem(manifest)
    if problem:  # one line naming the field, not a traceback from whichever reader met it first
        raise DataError(f"{path}: {problem} (edited or damaged manifest)")
    listed, total = sum(s["num_samples"] for s in manifest["shards"]), manifest["totals"]["samples"]
    if listed != total:
        raise DataError(f"{path}: its shards hold {listed} samples but totals.samples says {total} (edited manifest?)")
    if any("/" in s["name"] or s["name"].startswith(".") for s in manifest["shards"]):
        raise DataError(f"{path}: a shard name points outside the directory")
    manifest["options"] = upgrade_options(manifest["options"])
    return manifest


_COUNT = "a whole number >= 0"
SAMPLE_KINDS = choices(InstanceOptions, "samples")


def _of_type(value: Any, kind: type) -> bool:
    """`value` read from JSON as a `kind`: a float may be written as an integer, a bool is no number."""
    if isinstance(value, bool) or kind is bool:
        return isinstance(value, bool) and kind is bool
    return isinstance(value, (int, float) if kind is float else kind)


def _shape_problem(manifest: dict) -> str:
    """The first field of `manifest` (as prepare writes it) that is missing or of another type, named; ''."""

    def count(value: Any, positive: bool = False) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= (1 if positive else 0)

    options, totals, shards = manifest.get("options"), manifest.get("totals"), manifest.get("shards")
    if not isinstance(options, dict) or not isinstance(totals, dict) or not isinstance(shards, list):
        return "options and totals must be objects and shards a list"
    for name in ("samples_per_block", "max_seq_length"):
        if not count(options.get(name), positive=True):
            return f"options.{name} must be a whole number >= 1, got {options.get(name)!r}"
    for rule in dataclasses.fields(MaskingConfig):  # the masking rules prepare used, read back by inspect
        if rule.name in options and not _of_type(options[rule.name], type(getattr(MaskingConfig(), rule.name))):
            return f"options.{rule.name} must be a {type(getattr(MaskingConfig(), rule.name)).__name__}, got " + repr(
                options[rule.name]
            )
    samples = options.get("samples", options.get("objective", "nsp"))
    if samples not in SAMPLE_KINDS:
        return f"options.samples must be one of {', '.join(SAMPLE_KINDS)}, got {samples!r}"
    if not isinstance(manifest.get("vocab_sha256"), str):
        return "vocab_sha256 must be a string"
    if "mask_id" in manifest and not count(manifest["mask_id"]):
        return f"mask_id must be {_COUNT}, got {manifest['mask_id']!r}"
    for name in ("samples", "documents", "duplicate_documents", "empty_documents"):
        if name in totals or name == "samples":
            if not count(totals.get(name)):
                return f"totals.{name} must be {_COUNT}, got {totals.get(name)!r}"
    for name in ("inputs", "skipped_inputs"):
        if not isinstance(manifest.get(name, []), list):
            return f"{name} must be a list"
    if not all(
        isinstance(s, dict) and isinstance(s.get("reason", ""), str) for s in manifest.get("skipped_inputs", [])
    ):
        return "skipped_inputs must be objects with a reason"
    for i, shard in enumerate(shards):
        if not isinstance(shard, dict):
            return f"shards[{i}] must be an object"
        if not isinstance(shard.get("name"), str) or not isinstance(shard.get("sha256"), str):
            return f"shards[{i}].name and .sha256 must be strings"
        for name in ("bytes", "num_samples"):
            if not count(shard.get(name)):
                return f"shards[{i}].{name} must be {_COUNT}, got {shard.get(name)!r}"
        blocks = shard.get("blocks", [])
        if not isinstance(blocks, list) or not all(
            isinstance(b, list) and len(b) == 3 and count(b[0]) and count(b[1]) and isinstance(b[2], str)
            for b in blocks
        ):
            return f"shards[{i}].blocks must be [offset, size, sha256] triples"
    return ""


def iter_directory_samples(shard_dir: str, verify_checksums: bool = False) -> Iterator[dict[str, np.ndarray]]:
    for path, block in iter_directory_blocks(shard_dir, verify_checksums):
        yield from block.as_dicts()


def iter_directory_blocks(shard_dir: str, verify_checksums: bool = False) -> Iterator[tuple[str, Samples]]:
    """(shard path, block) of every block in storage order, each checked against the manifest."""
    manifest = read_manifest(shard_dir)
    blocks = shard_blocks(shard_dir, manifest)
    for shard in manifest["shards"]:
        path = storage.join(shard_dir, shard["name"])
        if verify_checksums and storage.file_sha256(path) != shard["sha256"]:
            raise DataError(f"{path}: sha256 differs from the manifest (corrupt or replaced shard)")
        for offset, size, count in blocks[shard["name"]]:
            yield path, read_block(path, (offset, size), count)


# ---- the shuffle across shards ------------------------------------------------------------------------------
# Shards are cut into bands of `band_shards` consecutive shards. Band b takes a contiguous range of the
# instances (in generation order: group by group), puts it through a seeded pseudo-random permutation and
# deals it round-robin to its shards. So a document's instances are spread over a band's shards, shards
# differ by at most one sample, each shard finds its own instances with the inverse permutation (nobody
# holds a permutation of N integers), and a shard reads from the few groups of its band's range, however
# large the corpus (with one band over all shards, every shard would read from every group: S x G reads).
# The loader shuffles blocks across all shards again every epoch.


def shard_instances(shard: int, num_shards: int, total: int, band_shards: int, key: int) -> np.ndarray:
    """The instances (indices in generation order) of `shard`, in the shard's order.

    Shard s holds total // num_shards instances, one more if s < total % num_shards."""
    base, extra = divmod(total, num_shards)

    def before(s):  # instances in the shards before s
        return s * base + min(s, extra)

    band = shard // band_shards
    first, stop = band * band_shards, min((band + 1) * band_shards, num_shards)
    start, size = before(first), before(stop) - before(first)
    positions = np.arange(shard - first, size, stop - first, dtype=np.int64)
    return start + permute(positions, size, key=(key << 20) + band, inverse=True)


_ROUNDS = 4
_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _round_function(x: np.ndarray, key: int, round_index: int, half_bits: int) -> np.ndarray:
    """A splitmix64-style mix of (x, key, round), truncated to half_bits."""
    with np.errstate(over="ignore"):
        z = x.astype(np.uint64) + np.uint64(
            (key * 0x9E3779B97F4A7C15 + round_index * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
        )
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return z & np.uint64((1 << half_bits) - 1)


def _feistel(x: np.ndarray, key: int, half_bits: int, inverse: bool) -> np.ndarray:
    mask = np.uint64((1 << half_bits) - 1)
    left, right = x >> np.uint64(half_bits), x & mask
    rounds = range(_ROUNDS - 1, -1, -1) if inverse else range(_ROUNDS)
    for r in rounds:
        if inverse:
            left, right = right ^ _round_function(left, key, r, half_bits), left
        else:
            left, right = right, left ^ _round_function(right, key, r, half_bits)
    return (left << np.uint64(half_bits)) | right


def permute(indices: np.ndarray, n: int, key: int, inverse: bool = False) -> np.ndarray:
    """A seeded bijection of [0, n) applied to `indices` (cycle-walking Feistel network), or its inverse."""
    half_bits = max(1, (max(n - 1, 1).bit_length() + 1) // 2)
    out = np.asarray(indices, dtype=np.uint64).copy()
    todo = np.arange(len(out))
    while len(todo):
        out[todo] = _feistel(out[todo], key, half_bits, inverse)
        todo = todo[out[todo] >= np.uint64(n)]
    return out.astype(np.int64)
