"""The DeepSeek-V4 KV cache of a whole model, for an engine: every layer's pools, the block
allocators, the requests' block tables, state slots and positions (exported as
``hdk.dsv4.KVCacheManager``; docs/dsv4-kv-cache.md, section "Python: KVCacheManager").

Per layer (all layers): an SWA ring, one page of 128 MODEL1 entries per request slot. CSA layers
(ratio 4) add a compressed pool, an indexer key pool (FP4) and two compressor states (main
d = 512, indexer d = 128); HCA layers (ratio 128) a compressed pool and one state. All CSA
layers share one block allocator and one block table per request (every CSA layer holds the same
entries of a request; the indexer keys use the same block ids as the entries), and so do all HCA
layers. Everything on the host here (allocation, tables) runs before a step, never inside a
captured CUDA graph.
"""

import dataclasses

import torch

from hdk.dsv4 import ops
from hdk._ops import HdkError

SWA_WINDOW = 128
CSA_RATIO, HCA_RATIO = 4, 128
INDEX_DIM = 128
MAX_HEADS = 128  # sparse_decode query heads of the larger preset (Pro)
MAX_TOP_K = 2048  # index_topk's largest top_k


def _flash_kinds(num_layers):
    return tuple("swa" if i < 2 else ("csa" if i % 2 == 0 else "hca") for i in range(num_layers))


def _pro_kinds(num_layers):
    return tuple("hca" if i < 2 else ("csa" if i % 2 == 0 else "hca") for i in range(num_layers))


# The spec's model constants (docs/spec.md, "Model constants"): layer counts without the MTP layer.
PRESETS = {"flash": (43, _flash_kinds), "pro": (61, _pro_kinds)}


def layer_kinds(preset, num_layers=None):
    """'swa' / 'csa' / 'hca' per layer of a preset ('flash': layers 0-1 SWA only, then CSA on
    even and HCA on odd layers; 'pro': 0-1 HCA, then the same), cut to ``num_layers``."""
    if preset not in PRESETS:
        raise HdkError(f"hdk.dsv4: unknown preset {preset!r}, expected one of {sorted(PRESETS)}")
    count, kinds = PRESETS[preset]
    return kinds(count if num_layers is None else int(num_layers))


class BlockAllocator:
    """A fixed pool of block ids, the rules of hdk::dsv4::BlockAllocator: a fresh pool hands out
    0, 1, 2, ...; later the most recently released ids first. allocate() and release() check
    everything first and change nothing when they raise HdkError."""

    def __init__(self, num_blocks, name="blocks"):
        if num_blocks < 0:
            raise HdkError(f"hdk.dsv4.BlockAllocator: num_blocks must be >= 0, got {num_blocks}")
        self.name = name
        self.capacity = int(num_blocks)
        self._free = list(range(self.capacity - 1, -1, -1))  # a stack, lowest id on top
        self._is_free = [True] * self.capacity

    def free_count(self):
        return len(self._free)

    def allocate(self, count):
        count = int(count)
        if count < 0:
            raise HdkError(f"hdk.dsv4.BlockAllocator: cannot allocate {count} blocks")
        if count > len(self._free):
            raise HdkError(
                f"hdk.dsv4.BlockAllocator ({self.name}): cannot allocate {count} blocks: "
                f"{len(self._free)} of {self.capacity} are free"
            )
        ids = [self._free.pop() for _ in range(count)]
        for block in ids:
            self._is_free[block] = False
        return ids

    def release(self, ids):
        ids = [int(block) for block in ids]
        seen = set()
        for block in ids:
            if not 0 <= block < self.capacity:
                raise HdkError(
                    f"hdk.dsv4.BlockAllocator ({self.name}): cannot release block {block}: not a "
                    f"block of this pool (0 .. {self.capacity - 1})"
                )
            if self._is_free[block]:
                raise HdkError(
                    f"hdk.dsv4.BlockAllocator ({self.name}): cannot release block {block}: it is "
                    "already free"
                )
            if block in seen:
                raise HdkError(
                    f"hdk.dsv4.BlockAllocator ({self.name}): cannot release block {block}: given "
                    "twice in one call"
                )
            seen.add(block)
        for block in ids:
            self._is_free[block] = True
            self._free.append(block)


@dataclasses.dataclass
class LayerCache:
    """One layer's tensors. ``kind`` 'swa', 'csa' or 'hca'; ``swa`` [max_requests, 128 * 584]
    uint8 (page = request slot); ``cache`` [blocks, block_size * 584] uint8 and ``state``
    [max_requests, A, 3, 512] fp32 (CSA and HCA); ``index_cache`` [blocks, block_size *
    key bytes] uint8 and ``index_state`` [max_requests, 3, 3, 128] fp32 (CSA)."""

    index: int
    kind: str
    swa: torch.Tensor
    ratio: int = 0
    cache: torch.Tensor = None
    state: torch.Tensor = None
    index_cache: torch.Tensor = None
    index_state: torch.Tensor = None


@dataclasses.dataclass
class StepInputs:
    """What one decode step's calls take, for a batch of N rows (padding rows: slot -1).
    ``positions`` [N] int64 (first position of the step's tokens), ``state_slots`` [N] int64,
    ``swa_slots`` [N] (T = 1) or [N, T] int64, ``csa_block_table`` / ``hca_block_table``
    [N, max_blocks] int32 (-1 past a request's pages); all on the manager's device.

    The read side's lists, one row per query token (N * T rows, row n * T + t): ``swa_window``
    [N * T, 128] int32, the ring slots token t attends to (-1 for none); ``csa_entries`` /
    ``hca_entries`` [N * T] int32, the compressed entries it sees ((position + 1) // ratio, 0
    for padding); ``csa_query_table`` [N * T, max_blocks] int32, the CSA block table row of each
    query token; ``hca_list`` [N * T, max HCA entries] int32, the HCA slots of every entry it
    sees (-1 beyond)."""

    positions: torch.Tensor
    state_slots: torch.Tensor
    swa_slots: torch.Tensor
    csa_block_table: torch.Tensor
    hca_block_table: torch.Tensor
    tokens_per_request: int
    swa_window: torch.Tensor = None
    csa_entries: torch.Tensor = None
    hca_entries: torch.Tensor = None
    csa_query_table: torch.Tensor = None
    hca_list: torch.Tensor = None


@dataclasses.dataclass
class _Request:
    slot: int
    position: int  # tokens seen (the next token's position)
    reserved: int  # the position up to which pages are held
    blocks: dict  # ratio -> [block ids], in page order


class KVCacheManager:
    """Owns every layer's pools of a DeepSeek-V4 model and the requests' pages.

    Args:
        preset: 'flash' or 'pro' (layer kinds from the spec), or an explicit sequence of
            'swa' / 'csa' / 'hca' per layer.
        num_layers: use the preset's first ``num_layers`` layers (small configs for tests).
        max_requests: request slots (SWA pages and compressor states per layer).
        csa_blocks, hca_blocks: pages of the CSA (ratio 4) and HCA (ratio 128) pools, each shared
            by every layer of that kind.
        block_size, hca_block_size: entries per page of the CSA / HCA pools.
        max_context: the longest request (tokens); sizes the block tables' columns.
        key_format: 'mxfp4', 'nvfp4' or 'fp8' for the indexer keys (``index_cache`` pages of
            ``block_size * KEY_BYTES[key_format]`` bytes: 68, 72 or 132 a key).
        device: where the pools live.

    ``workspace`` is the one workspace (uint8, on CUDA; None on the CPU) that every
    :meth:`index_topk` and :meth:`attend` call of the manager gets: sized at construction for
    ``max_requests`` query rows of up to 128 heads, top-k 2048 and the longest HCA list, and grown
    by a call that needs more (before graph capture, run such a call once outside it).
    """

    def __init__(
        self,
        preset="flash",
        *,
        num_layers=None,
        max_requests=8,
        csa_blocks=64,
        hca_blocks=16,
        block_size=64,
        hca_block_size=64,
        max_context=65536,
        key_format="mxfp4",
        device="cpu",
    ):
        kinds = layer_kinds(preset, num_layers) if isinstance(preset, str) else tuple(preset)
        if any(kind not in ("swa", "csa", "hca") for kind in kinds):
            raise HdkError(f"hdk.dsv4.KVCacheManager: layer kinds must be swa/csa/hca: {kinds}")
        ops._key_format(key_format)
        self.kinds = kinds
        self.max_requests = int(max_requests)
        self.block_size = {CSA_RATIO: int(block_size), HCA_RATIO: int(hca_block_size)}
        self.max_context = int(max_context)
        self.key_format = key_format
        self.device = torch.device(device)
        self.allocators = {
            CSA_RATIO: BlockAllocator(csa_blocks, "CSA pool"),
            HCA_RATIO: BlockAllocator(hca_blocks, "HCA pool"),
        }
        self.max_blocks = {
            ratio: max(1, -(-(self.max_context // ratio) // size))
            for ratio, size in self.block_size.items()
        }
        # Block tables by request slot, on the host (the truth) and on the device (what steps
        # read); -1 past a request's pages.
        self._tables = {
            ratio: torch.full((self.max_requests, self.max_blocks[ratio]), -1, dtype=torch.int32)
            for ratio in self.block_size
        }
        self._device_tables = {ratio: t.to(self.device) for ratio, t in self._tables.items()}
        self._free_slots = list(range(self.max_requests - 1, -1, -1))
        self._requests = {}
        self.layers = [
            self._make_layer(i, kind, csa_blocks, hca_blocks) for i, kind in enumerate(kinds)
        ]
        self.workspace = None
        longest = SWA_WINDOW + max(MAX_TOP_K, self._capacity(HCA_RATIO))
        self._workspace_for(
            lambda: max(
                ops.index_topk_workspace_bytes(
                    self.max_requests, self._capacity(CSA_RATIO), self.device
                ),
                ops.sparse_decode_workspace_bytes(
                    self.max_requests, MAX_HEADS, longest, self.device
                ),
            )
        )

    def _capacity(self, ratio):
        """Entries a request's block table row of the ratio's pool addresses."""
        return self.max_blocks[ratio] * self.block_size[ratio]

    def _workspace_for(self, size):
        """The manager's workspace, first grown to ``size()`` bytes if it holds fewer; None on
        the CPU (which uses none)."""
        if self.device.type != "cuda":
            return None
        try:
            needed = size()
        except (AttributeError, IndexError, TypeError):
            return self.workspace  # malformed arguments: the call's validation names them
        if needed > (0 if self.workspace is None else self.workspace.numel()):
            self.workspace = torch.empty(needed, dtype=torch.uint8, device=self.device)
        return self.workspace

    def _pass_workspace(self, options, size):
        """Gives a call the manager's workspace unless the caller passed one."""
        if "workspace" not in options:
            options["workspace"] = self._workspace_for(size)

    def _make_layer(self, index, kind, csa_blocks, hca_blocks):
        def zeros(*shape, dtype=torch.uint8):
            return torch.zeros(shape, dtype=dtype, device=self.device)

        layer = LayerCache(index, kind, zeros(self.max_requests, SWA_WINDOW * ops.ENTRY_BYTES))
        if kind == "swa":
            return layer
        ratio = CSA_RATIO if kind == "csa" else HCA_RATIO
        blocks = csa_blocks if kind == "csa" else hca_blocks
        size = self.block_size[ratio]
        layer.ratio = ratio
        layer.cache = zeros(blocks, size * ops.ENTRY_BYTES)
        accumulators = ops.compressor_accumulators(ratio)
        layer.state = zeros(self.max_requests, accumulators, 3, 512, dtype=torch.float32)
        if kind == "csa":
            layer.index_cache = zeros(blocks, size * ops.KEY_BYTES[self.key_format])
            layer.index_state = zeros(
                self.max_requests, accumulators, 3, INDEX_DIM, dtype=torch.float32
            )
        return layer

    # -- requests -------------------------------------------------------------------------

    def _need(self, before, after):
        return {
            ratio: ops.blocks_to_reserve(ratio, self.block_size[ratio], before, after)
            for ratio in self.block_size
        }

    def _check_free(self, operation, need):
        for ratio, count in need.items():
            allocator = self.allocators[ratio]
            if count > allocator.free_count():
                raise HdkError(
                    f"hdk.dsv4.KVCacheManager.{operation}: the {allocator.name} is exhausted: "
                    f"{count} blocks requested, {allocator.free_count()} free (of "
                    f"{allocator.capacity}); nothing was reserved"
                )

    def _check_context(self, operation, request_id, after):
        if after > self.max_context:
            raise HdkError(
                f"hdk.dsv4.KVCacheManager.{operation}: request {request_id!r} would reach "
                f"{after} tokens, beyond max_context = {self.max_context}"
            )

    def _take(self, request, need):
        for ratio, count in need.items():
            ids = self.allocators[ratio].allocate(count)
            if not ids:
                continue
            start = len(request.blocks[ratio])
            request.blocks[ratio].extend(ids)
            row = torch.tensor(ids, dtype=torch.int32)
            self._tables[ratio][request.slot, start : start + len(ids)] = row
            self._device_tables[ratio][request.slot, start : start + len(ids)] = row.to(self.device)

    def admit_request(self, request_id, prompt_length=0):
        """Takes a request slot and the pages of the ``prompt_length`` tokens' compressed
        entries (a prefill fills them and the state). Returns the request's slot."""
        if request_id in self._requests:
            raise HdkError(
                f"hdk.dsv4.KVCacheManager.admit_request: request {request_id!r} is "
                "already admitted"
            )
        if not self._free_slots:
            raise HdkError(
                f"hdk.dsv4.KVCacheManager.admit_request: all {self.max_requests} "
                "request slots are taken"
            )
        prompt_length = int(prompt_length)
        if prompt_length < 0:
            raise HdkError(
                "hdk.dsv4.KVCacheManager.admit_request: prompt_length must be >= 0, "
                f"got {prompt_length}"
            )
        self._check_context("admit_request", request_id, prompt_length)
        need = self._need(0, prompt_length)
        self._check_free("admit_request", need)
        request = _Request(
            self._free_slots.pop(),
            prompt_length,
            prompt_length,
            {ratio: [] for ratio in self.block_size},
        )
        self._take(request, need)
        self._requests[request_id] = request
        return request.slot

    def release_request(self, request_id):
        """Returns the request's pages and slot. An unknown (or already released) id raises."""
        request = self._request("release_request", request_id)
        for ratio, ids in request.blocks.items():
            self.allocators[ratio].release(ids)
            self._tables[ratio][request.slot] = -1
            self._device_tables[ratio][request.slot] = -1
        self._free_slots.append(request.slot)
        del self._requests[request_id]

    def _request(self, operation, request_id):
        if request_id not in self._requests:
            raise HdkError(
                f"hdk.dsv4.KVCacheManager.{operation}: request {request_id!r} is not "
                "admitted (never, or already released)"
            )
        return self._requests[request_id]

    def reserve_for_step(self, request_ids, tokens_per_request=1):
        """Reserves the pages the next step's compress calls write for each request (position
        p -> p + tokens_per_request), all or nothing: on exhaustion raises HdkError naming the
        free and requested counts and changes nothing. Calling it again before advance() takes
        nothing more. Returns the blocks taken per pool, {'csa': n, 'hca': n}."""
        tokens = int(tokens_per_request)
        if not 1 <= tokens <= CSA_RATIO:
            raise HdkError(
                "hdk.dsv4.KVCacheManager.reserve_for_step: tokens_per_request must "
                f"be 1 .. {CSA_RATIO} (one window per call), got {tokens}"
            )
        live = [request_id for request_id in request_ids if request_id is not None]
        if len(set(live)) != len(live):
            raise HdkError(
                f"hdk.dsv4.KVCacheManager.reserve_for_step: a request appears twice "
                f"in {list(request_ids)}"
            )
        plan = []
        total = {ratio: 0 for ratio in self.block_size}
        for request_id in request_ids:
            if request_id is None:
                continue
            request = self._request("reserve_for_step", request_id)
            after = request.position + tokens
            self._check_context("reserve_for_step", request_id, after)
            need = self._need(request.reserved, max(after, request.reserved))
            plan.append((request, after, need))
            for ratio, count in need.items():
                total[ratio] += count
        self._check_free("reserve_for_step", total)
        for request, after, need in plan:
            self._take(request, need)
            request.reserved = max(request.reserved, after)
        return {"csa": total[CSA_RATIO], "hca": total[HCA_RATIO]}

    def advance(self, request_ids, tokens_per_request=1):
        """Moves the requests' positions on after a step ran (within what was reserved)."""
        for request_id in request_ids:
            if request_id is None:
                continue
            request = self._request("advance", request_id)
            if request.position + tokens_per_request > request.reserved:
                raise HdkError(
                    f"hdk.dsv4.KVCacheManager.advance: request {request_id!r} at position "
                    f"{request.position} + {tokens_per_request} tokens is beyond its reserved "
                    f"{request.reserved}; call reserve_for_step first"
                )
        for request_id in request_ids:
            if request_id is not None:
                self._requests[request_id].position += int(tokens_per_request)

    # -- what the step's calls take -------------------------------------------------------

    def slot(self, request_id):
        return self._request("slot", request_id).slot

    def position(self, request_id):
        return self._request("position", request_id).position

    def blocks(self, request_id, kind):
        """The request's block ids of the 'csa' or 'hca' pool, in page order."""
        ratio = CSA_RATIO if kind == "csa" else HCA_RATIO
        return list(self._request("blocks", request_id).blocks[ratio])

    def block_table(self, kind, request_ids):
        """[N, max_blocks] int32 block table rows of the 'csa' or 'hca' pool for a batch (None:
        a padding row of -1), on the device."""
        ratio = CSA_RATIO if kind == "csa" else HCA_RATIO
        slots = self._slots(request_ids)
        table = self._device_tables[ratio].index_select(0, slots.clamp(min=0).to(self.device))
        return table.masked_fill_((slots < 0).to(self.device)[:, None], -1)

    def _slots(self, request_ids):
        return torch.tensor(
            [-1 if r is None else self._request("step_inputs", r).slot for r in request_ids],
            dtype=torch.int64,
        )

    def step_inputs(self, request_ids, tokens_per_request=1):
        """The positions, state slots, SWA slots and block tables of one step for a batch (None
        entries are padding rows). Check with reserve_for_step first; advance() after."""
        tokens = int(tokens_per_request)
        slots = self._slots(request_ids)
        positions = torch.tensor(
            [0 if r is None else self._requests[r].position for r in request_ids],
            dtype=torch.int64,
        )
        token_positions = positions[:, None] + torch.arange(tokens)
        swa = slots[:, None] * SWA_WINDOW + token_positions % SWA_WINDOW
        swa = torch.where(slots[:, None] >= 0, swa, torch.full_like(swa, -1))
        csa_table = self.block_table("csa", request_ids)
        hca_table = self.block_table("hca", request_ids)
        # One row per query token. Token t at position p sees the ring positions
        # last - 127 .. p, last being the step's last token: the step's later tokens were stored
        # before attention and took the ring places of last - 127 .. p - 128.
        live = (slots >= 0).repeat_interleave(tokens)
        query = token_positions.reshape(-1)
        last = (positions + tokens - 1).repeat_interleave(tokens)
        seen = query[:, None] - torch.arange(SWA_WINDOW)
        window = slots.repeat_interleave(tokens)[:, None] * SWA_WINDOW + seen % SWA_WINDOW
        visible = live[:, None] & (seen >= 0) & (seen > last[:, None] - SWA_WINDOW)
        window = torch.where(visible, window, torch.full_like(window, -1)).to(torch.int32)
        entries = {
            ratio: torch.where(live, (query + 1) // ratio, torch.zeros_like(query)).to(torch.int32)
            for ratio in (CSA_RATIO, HCA_RATIO)
        }
        hca_rows = hca_table.repeat_interleave(tokens, 0)
        return StepInputs(
            positions=positions.to(self.device),
            state_slots=slots.to(self.device),
            swa_slots=(swa[:, 0] if tokens == 1 else swa).to(self.device),
            csa_block_table=csa_table,
            hca_block_table=hca_table,
            tokens_per_request=tokens,
            swa_window=window.to(self.device),
            csa_entries=entries[CSA_RATIO].to(self.device),
            hca_entries=entries[HCA_RATIO].to(self.device),
            csa_query_table=csa_table.repeat_interleave(tokens, 0),
            hca_list=self._entry_slots(hca_rows, entries[HCA_RATIO], HCA_RATIO),
        )

    def _entry_slots(self, table, counts, ratio):
        """[rows, max_blocks * block_size] int32: the slots of entries 0 .. counts[row] - 1
        through the table's rows, -1 beyond (built on the device)."""
        size = self.block_size[ratio]
        entry = torch.arange(table.shape[1] * size, device=self.device)
        blocks = table.long().index_select(1, entry // size)
        slots = blocks * size + entry % size
        keep = entry[None, :] < counts.to(self.device).long()[:, None]
        return torch.where(keep, slots, torch.full_like(slots, -1)).to(torch.int32)

    # -- the calls of one layer -----------------------------------------------------------

    def store_swa(self, layer, values, step, **options):
        """store_entries of the step's rows ([N, 512], or [N * T, 512] in row-major (n, t)
        order) into the layer's SWA ring."""
        layer = self.layers[layer] if isinstance(layer, int) else layer
        return ops.store_entries(
            values, step.swa_slots.reshape(-1), layer.swa, SWA_WINDOW, **options
        )

    def compress(
        self,
        layer,
        step,
        kv,
        score,
        ape,
        norm_weight,
        rope_cos,
        rope_sin,
        *,
        indexer=False,
        **options,
    ):
        """The layer's compress call (``indexer=True``: the CSA indexer's, d = 128) with the
        step's positions, state slots and block table."""
        layer = self.layers[layer] if isinstance(layer, int) else layer
        if layer.kind == "swa" or (indexer and layer.kind != "csa"):
            raise HdkError(
                f"hdk.dsv4.KVCacheManager.compress: layer {layer.index} is "
                f"{layer.kind.upper()}, it has no {'indexer ' if indexer else ''}"
                "compressor"
            )
        table = step.csa_block_table if layer.kind == "csa" else step.hca_block_table
        if indexer:
            options.setdefault("key_format", self.key_format)
        return ops.compress(
            kv,
            score,
            ape,
            step.positions,
            step.state_slots,
            layer.index_state if indexer else layer.state,
            norm_weight,
            rope_cos,
            rope_sin,
            table,
            layer.index_cache if indexer else layer.cache,
            self.block_size[layer.ratio],
            layer.ratio,
            **options,
        )

    def _compressor_call(self, layer, step, inputs, rope_cos, rope_sin, is_indexer, options):
        """One compress call of ``layer`` as a dict of :func:`hdk.dsv4.compress`'s arguments:
        ``inputs`` = ``(kv, score, ape, norm_weight)``, the step's positions, state slots and
        block table, the layer's state and cache (the indexer's when ``is_indexer``)."""
        kv, score, ape, norm_weight = inputs
        call = dict(
            kv=kv,
            score=score,
            ape=ape,
            positions=step.positions,
            state_slots=step.state_slots,
            state=layer.index_state if is_indexer else layer.state,
            norm_weight=norm_weight,
            rope_cos=rope_cos,
            rope_sin=rope_sin,
            block_table=step.csa_block_table if layer.kind == "csa" else step.hca_block_table,
            cache=layer.index_cache if is_indexer else layer.cache,
            block_size=self.block_size[layer.ratio],
            ratio=layer.ratio,
            **options,
        )
        if is_indexer:
            call.setdefault("key_format", self.key_format)
        return call

    def compress_csa(self, layer, step, main, indexer, rope_cos, rope_sin, **options):
        """A CSA layer's two compress calls in one launch (:func:`hdk.dsv4.compress_pair`):
        ``main`` and ``indexer`` are each ``(kv, score, ape, norm_weight)``, the arguments
        :meth:`compress` takes for the main (d = 512) and the indexer (d = 128) compressor. The
        same bytes as those two calls; other options (``norm_eps``, ``invalid_count``,
        ``check_indices``) serve both."""
        layer = self.layers[layer] if isinstance(layer, int) else layer
        if layer.kind != "csa":
            raise HdkError(
                f"hdk.dsv4.KVCacheManager.compress_csa: layer {layer.index} is "
                f"{layer.kind.upper()}; only CSA layers have two compressors"
            )
        both = ("invalid_count", "check_indices")
        shared = {key: options.pop(key) for key in both if key in options}
        calls = [
            self._compressor_call(layer, step, inputs, rope_cos, rope_sin, is_indexer, options)
            for inputs, is_indexer in ((main, False), (indexer, True))
        ]
        return ops.compress_pair(calls[0], calls[1], **shared)

    def store_and_compress(
        self, layer, step, values, main, rope_cos, rope_sin, *, indexer=None, **options
    ):
        """A CSA or HCA layer's cache writes of the step in one launch
        (:func:`hdk.dsv4.store_and_compress`): :meth:`store_swa`'s ``values`` into the layer's
        SWA ring with the layer's compressor (``main`` = ``(kv, score, ape, norm_weight)``, as
        :meth:`compress` takes them) and, for a CSA layer, the indexer's compressor (``indexer``,
        the same four for d = 128). The same bytes as :meth:`store_swa` then :meth:`compress_csa`
        (or :meth:`compress`), one launch fewer; other options (``norm_eps``, ``invalid_count``,
        ``check_indices``) serve every call."""
        layer = self.layers[layer] if isinstance(layer, int) else layer
        name = "hdk.dsv4.KVCacheManager.store_and_compress"
        if layer.kind == "swa":
            raise HdkError(
                f"{name}: layer {layer.index} is SWA, it has no compressor (use store_swa)"
            )
        if (layer.kind == "csa") != (indexer is not None):
            raise HdkError(
                f"{name}: layer {layer.index} is {layer.kind.upper()}, "
                + (
                    "give its indexer compressor's inputs as indexer=(kv, score, ape, norm_weight)"
                    if layer.kind == "csa"
                    else "it has no indexer compressor (indexer must be None)"
                )
            )
        both = ("invalid_count", "check_indices")
        shared = {key: options.pop(key) for key in both if key in options}
        store = dict(
            values=values,
            slots=step.swa_slots.reshape(-1),
            cache=layer.swa,
            block_size=SWA_WINDOW,
        )
        calls = [self._compressor_call(layer, step, main, rope_cos, rope_sin, False, options)]
        if indexer is not None:
            calls.append(
                self._compressor_call(layer, step, indexer, rope_cos, rope_sin, True, options)
            )
        return ops.store_and_compress(store, *calls, **shared)

    def index_topk(self, layer, step, q, weights, top_k, *, topk_slots=None, **options):
        """CSA layers: the indexer's top-k over the layer's key pool for the step's query rows
        (``q`` [N * T, H, 128] in the form the manager's ``key_format`` takes: bf16/fp32, or E4M3
        codes for fp8, or packed E2M1 [N * T, H, 64] with ``q_scales=`` for mxfp4; ``weights``
        [N * T, H]). Returns ``(topk_indices, topk_scores, topk_slots)``; ``topk_slots`` are the
        selected entries' slots in the layer's compressed pool, :meth:`attend`'s ``selected``.
        Other options (``q_scales`` among them) go to :func:`hdk.dsv4.index_topk`."""
        layer = self.layers[layer] if isinstance(layer, int) else layer
        if layer.kind != "csa":
            raise HdkError(
                f"hdk.dsv4.KVCacheManager.index_topk: layer {layer.index} is "
                f"{layer.kind.upper()}; only CSA layers have an indexer"
            )
        if topk_slots is None:
            rows = step.csa_entries.shape[0]
            topk_slots = torch.empty((rows, int(top_k)), dtype=torch.int32, device=self.device)
        options.setdefault("format", self.key_format)
        self._pass_workspace(
            options,
            lambda: ops.index_topk_workspace_bytes(
                q.shape[0], self._capacity(CSA_RATIO), self.device
            ),
        )
        indices, scores = ops.index_topk(
            q,
            weights,
            layer.index_cache,
            self.block_size[CSA_RATIO],
            step.csa_query_table,
            step.csa_entries,
            top_k,
            topk_slots=topk_slots,
            **options,
        )
        return indices, scores, topk_slots

    def attend(self, layer, step, q, *, sink=None, selected=None, **options):
        """sparse_decode of the step's query rows (``q`` [N * T, Hq, 512]) over the SWA window
        plus, on CSA layers, the ``selected`` entries (:meth:`index_topk`'s ``topk_slots``), on
        HCA layers every compressed entry so far. Returns ``(out, lse)``; other options go to
        :func:`hdk.dsv4.sparse_decode`."""
        layer = self.layers[layer] if isinstance(layer, int) else layer
        if layer.kind == "swa":
            self._pass_workspace(
                options,
                lambda: ops.sparse_decode_workspace_bytes(
                    q.shape[0], q.shape[1], SWA_WINDOW, self.device
                ),
            )
            return ops.sparse_decode(
                q, layer.swa, SWA_WINDOW, step.swa_window, sink=sink, **options
            )
        if layer.kind == "csa" and selected is None:
            raise HdkError(
                f"hdk.dsv4.KVCacheManager.attend: layer {layer.index} is CSA: pass selected= "
                "(the topk_slots of index_topk)"
            )
        if layer.kind == "hca" and selected is not None:
            raise HdkError(
                f"hdk.dsv4.KVCacheManager.attend: layer {layer.index} is HCA: it attends to every "
                "compressed entry, selected= is not taken"
            )
        listed = selected if layer.kind == "csa" else step.hca_list
        self._pass_workspace(
            options,
            lambda: ops.sparse_decode_workspace_bytes(
                q.shape[0], q.shape[1], SWA_WINDOW + listed.shape[-1], self.device
            ),
        )
        return ops.sparse_decode(
            q,
            layer.cache,
            self.block_size[layer.ratio],
            selected if layer.kind == "csa" else step.hca_list,
            extra_cache=layer.swa,
            extra_block_size=SWA_WINDOW,
            extra_indices=step.swa_window,
            sink=sink,
            **options,
        )

    # -- accounting -----------------------------------------------------------------------

    def free_blocks(self):
        return {
            "csa": self.allocators[CSA_RATIO].free_count(),
            "hca": self.allocators[HCA_RATIO].free_count(),
        }

    def requests(self):
        return list(self._requests)

    def memory_bytes(self):
        """Bytes of the tensors this manager owns, per kind and in total: 'swa', 'csa', 'hca'
        (compressed pools), 'indexer' (key pools), 'state' (compressor states), 'block_tables'
        (device copies), 'total'."""

        def size(tensor):
            return 0 if tensor is None else tensor.numel() * tensor.element_size()

        result = dict.fromkeys(("swa", "csa", "hca", "indexer", "state"), 0)
        for layer in self.layers:
            result["swa"] += size(layer.swa)
            if layer.kind != "swa":
                result[layer.kind] += size(layer.cache)
            result["indexer"] += size(layer.index_cache)
            result["state"] += size(layer.state) + size(layer.index_state)
        result["block_tables"] = sum(size(t) for t in self._device_tables.values())
        result["total"] = sum(result.values())
        return result
