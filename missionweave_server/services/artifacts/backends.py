"""Choosing and configuring the blob backend.

| variable             | default                         | meaning                                          |
|----------------------|---------------------------------|--------------------------------------------------|
| MWP_DATA_DIR         | ./.missionweave                 | local backend: blobs under ``<data dir>/blobs/`` |
| MWP_S3_BUCKET        | (unset)                         | set: the S3 backend, objects ``blobs/<hex>``     |
| MWP_S3_ENDPOINT      | (AWS S3)                        | S3-compatible endpoint URL (MinIO, Ceph, moto)   |
| MWP_S3_REGION        | AWS_DEFAULT_REGION / AWS_REGION | client region, and where a new bucket is created |
| MWP_S3_CREATE_BUCKET | false                           | create the bucket on first use when missing      |
| MWP_BLOB_DIRECT_IO   | true                            | local backend: write large blobs with O_DIRECT   |
| AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, ... | boto3's chain | credentials (env, profile, instance role)  |

Details: docs/artifacts-storage.md. The backend modules are imported lazily: the local default never
pays for importing boto3.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from missionweave.kernel.env import env_flag
from missionweave_server.services.artifacts.blobstore import BlobStore


@dataclass(frozen=True)
class BlobStoreConfig:
    data_dir: Path
    s3_bucket: str = ""
    s3_endpoint: str = ""
    s3_region: str = ""
    s3_create_bucket: bool = False
    direct_io: bool = True

    @property
    def backend(self) -> str:
        return "s3" if self.s3_bucket else "local"

    @classmethod
    def from_env(cls, data_dir: Path | str, env: Mapping[str, str] | None = None) -> BlobStoreConfig:
        e = os.environ if env is None else env
        return cls(
            data_dir=Path(data_dir),
            s3_bucket=e.get("MWP_S3_BUCKET", "").strip(),
            s3_endpoint=e.get("MWP_S3_ENDPOINT", "").strip(),
            s3_region=e.get("MWP_S3_REGION", "").strip(),
            s3_create_bucket=env_flag(e, "MWP_S3_CREATE_BUCKET"),
            direct_io=env_flag(e, "MWP_BLOB_DIRECT_IO") if "MWP_BLOB_DIRECT_IO" in e else True,
        )


def make_blobstore(
    data_dir: Path | str,
    *,
    s3_bucket: str = "",
    s3_endpoint: str = "",
    s3_region: str = "",
    s3_create_bucket: bool = False,
    direct_io: bool = True,
) -> BlobStore:
    """The local store under ``data_dir`` unless a bucket is named, then S3.

    An endpoint without a bucket is refused rather than silently falling back to local disk: that
    configuration means the operator wanted S3 and forgot half of it.
    """
    if s3_endpoint and not s3_bucket:
        raise ValueError("MWP_S3_ENDPOINT is set but MWP_S3_BUCKET is not: name the bucket")
    if s3_bucket:
        from missionweave_server.services.artifacts.s3 import S3BlobStore

        return S3BlobStore(
            s3_bucket,
            endpoint_url=s3_endpoint or None,
            region=s3_region or None,
            create_bucket=s3_create_bucket,
        )
    from missionweave_server.services.artifacts.local import LocalBlobStore

    return LocalBlobStore(data_dir, direct_io=direct_io)


def blobstore_from_config(config: BlobStoreConfig) -> BlobStore:
    return make_blobstore(
        config.data_dir,
        s3_bucket=config.s3_bucket,
        s3_endpoint=config.s3_endpoint,
        s3_region=config.s3_region,
        s3_create_bucket=config.s3_create_bucket,
        direct_io=config.direct_io,
    )


def blobstore_from_env(data_dir: Path | str, env: Mapping[str, str] | None = None) -> BlobStore:
    """What ``mwp serve`` uses: the data directory from Settings, the S3 variables from the env."""
    return blobstore_from_config(BlobStoreConfig.from_env(data_dir, env))
