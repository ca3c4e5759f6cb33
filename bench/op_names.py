"""aten op names shared by the decode-step counters (bench/decode_kernel_count.py, bench/decode_profile.py)."""

# Views, reshapes, allocations and no-op casts: ops that launch no device work of their own.
NO_DEVICE_WORK = frozenset({
    "view", "_unsafe_view", "t", "transpose", "reshape", "_reshape_alias", "flatten", "split", "split_with_sizes",
    "chunk", "slice", "select", "narrow", "unbind", "unsqueeze", "squeeze", "expand", "permute", "as_strided",
    "as_strided_", "alias", "detach", "empty", "empty_like", "empty_strided", "new_empty", "lift_fresh", "to",
    "contiguous", "resolve_conj", "resolve_neg", "promote_types", "result_type",
})
