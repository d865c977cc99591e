"""moto's S3 server, started with a bucket already filled from a directory.

Usage: python moto_seeded.py --seed-dir DIR --bucket NAME -H HOST -p PORT

Every regular file under DIR becomes the object of BUCKET whose key is its path relative to
DIR (with `/`). The objects are put into moto's in-memory backend in this process before the
server starts (about 20,000 a second, where PUTs over HTTP run at about 170 a second on the
2-core CI machine), then the server serves them like any other: tests that need a bucket of
many objects (listing pages, reads under a low file limit) spend their time on what they test.
"""

import argparse
import os
import sys

from moto.core import DEFAULT_ACCOUNT_ID
from moto.s3.models import s3_backends
from moto.server import main as moto_main


def seed(directory: str, bucket: str) -> int:
    backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
    backend.create_bucket(bucket, "us-east-1")
    count = 0
    for root, _dirs, files in os.walk(directory):
        for name in files:
            path = os.path.join(root, name)
            key = os.path.relpath(path, directory).replace(os.sep, "/")
            with open(path, "rb") as f:
                backend.put_object(bucket, key, f.read())
            count += 1
    return count


def main() -> None:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--seed-dir", required=True)
    parser.add_argument("--bucket", required=True)
    args, rest = parser.parse_known_args()
    count = seed(args.seed_dir, args.bucket)
    print(f"moto_seeded: {count} objects in bucket {args.bucket}", file=sys.stderr, flush=True)
    moto_main(rest)


if __name__ == "__main__":
    main()
