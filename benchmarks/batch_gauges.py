"""What the provider batch gauges add to a scrape (README "Metrics"): ``batch_gauges()`` over a
store holding BATCHES ended batches (the cost sum reads each of their rows) plus open batches and
WAITING + BATCHED items (read through the state indexes). It writes those rows into the database
of AIJOB_DATABASE_URL (use a scratch one: the rows are deleted at the end) and prints the median
time of a read of the three gauges.

    AIJOB_DATABASE_URL=mysql://root@127.0.0.1:3306/scratch python benchmarks/batch_gauges.py \\
        [--batches 20000] [--items 1000] [--rounds 20]
"""

import argparse
import datetime
import os
import statistics
import sys
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine.extensions import load_config  # noqa: E402
from engine.features.batches.models import AiProviderBatch, AiProviderBatchItem
from engine.features.batches.routes import batch_gauges  # noqa: E402
from engine.runtime import Runtime  # noqa: E402

CHUNK = 1000


def fill(store, batches, items):
    now = store.clock()
    rows = [
        {
            'id': str(uuid.uuid4()),
            'provider': 'openai',
            'model': 'gpt-4o-mini',
            'state': 'ended' if n >= 10 else 'submitted',
            'cost': '0.125000',
            'created_at': now - datetime.timedelta(seconds=n),
            'updated_at': now,
        }
        for n in range(batches)
    ]
    for start in range(0, len(rows), CHUNK):
        AiProviderBatch.insert_many(rows[start : start + CHUNK]).execute()
    item_rows = [
        dict(
            job_id=str(uuid.uuid4()),
            attempt_no=1,
            custom_id='bench-%d' % n,
            group_key='openai/gpt-4o-mini',
            batch_id=rows[0]['id'] if n % 2 else None,
            state='batched' if n % 2 else 'waiting',
            request={},
            max_wait_ms=60000,
            max_jobs=50,
            parked_attempt=1,
            created_at=now,
            updated_at=now,
        )
        for n in range(items)
    ]
    for start in range(0, len(item_rows), CHUNK):
        AiProviderBatchItem.insert_many(item_rows[start : start + CHUNK]).execute()
    return [row['id'] for row in rows]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument('--batches', type=int, default=20000)
    parser.add_argument('--items', type=int, default=1000)
    parser.add_argument('--rounds', type=int, default=20)
    args = parser.parse_args()
    runtime = Runtime(load_config(dict(os.environ, AIJOB_REDIS_URL='')), role='bench')
    runtime.create_schema()
    with runtime.store.connection():
        ids = fill(runtime.store, args.batches, args.items)
        try:
            times = []
            for _ in range(args.rounds):
                started = time.perf_counter()
                batch_gauges()
                times.append(time.perf_counter() - started)
        finally:
            for start in range(0, len(ids), CHUNK):
                AiProviderBatch.delete().where(
                    AiProviderBatch.id.in_(ids[start : start + CHUNK])
                ).execute()
            AiProviderBatchItem.delete().where(
                AiProviderBatchItem.custom_id.startswith('bench-')
            ).execute()
    print(
        'batch gauges over %d batches and %d items: median %.2f ms, max %.2f ms (%d rounds)'
        % (
            args.batches,
            args.items,
            statistics.median(times) * 1000,
            max(times) * 1000,
            args.rounds,
        )
    )
    runtime.close()


if __name__ == '__main__':
    main()
