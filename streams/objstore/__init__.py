"""Rowtime streams on object storage: ``s3://bucket/prefix`` and ``az://container/prefix``
(also ``azure://`` and ``abfs[s]://container@account.dfs.core.windows.net/prefix``), on obstore
(Rust's ``object_store``), with no lock server: conditional creates of numbered commit objects
and a compare-and-swap lease (``log``, ``lease``), the sink's state below the target
(``sink``) and the Parquet target's files (``files``), locations and clients from the
standard environment variables (``location``), creating and opening streams and the backend
(``create``).

Install with ``pip install 'pyspark-rowtime[cloud]'``. Served through the storage seam
(``storage.register_backend``): the reader and the sink do not know it by name.
"""

from __future__ import annotations

from .create import OBJECT_STORE_BACKEND as BACKEND

#: The URL schemes this backend serves (each an entry point ``pyspark_rowtime.backends``).
SCHEMES = ("s3", "s3a", "az", "azure", "abfs", "abfss")

__all__ = ["BACKEND", "SCHEMES"]
