"""Kept for users of 0.1.0, whose README named ``streams.redis_log.register_external``: the
Redis backend is now the package ``redis``, which this module only re-exports from."""

from __future__ import annotations

from .redis import register_external

__all__ = ["register_external"]
