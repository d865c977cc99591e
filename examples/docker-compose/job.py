"""A small Ray job for the Docker Compose example.

Runs in the `ray` container (`docker compose exec ray python /home/ray/job.py`):
connects to the running Ray head, runs a few tasks (one of them fails on
purpose) and an actor, then waits until the collector, reachable on
127.0.0.1:8084 because the containers share a network namespace, has stopped
receiving events (Ray's dashboard agent sends them in the background).
"""

import time
import urllib.request

import ray

METRICS = "http://127.0.0.1:8084/metrics"
METRIC = "rhc_events_accepted_total"


def accepted():
    with urllib.request.urlopen(METRICS, timeout=5) as resp:
        text = resp.read().decode()
    # The counter's lines: `name value` or `name{labels} value`.
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(METRIC) and line[len(METRIC):len(METRIC) + 1] in (" ", "{")
    )


@ray.remote
def square(x):
    return x * x


@ray.remote(max_retries=0)
def fails():
    raise RuntimeError("this task fails on purpose")


@ray.remote
class Counter:
    def __init__(self):
        self.n = 0

    def add(self, k):
        self.n += k
        return self.n


def main():
    ray.init(address="auto")
    print("sum of squares:", sum(ray.get([square.remote(i) for i in range(20)])))
    try:
        ray.get(fails.remote())
    except ray.exceptions.RayTaskError:
        print("the failing task failed, as it should")
    counter = Counter.remote()
    print("counter:", ray.get([counter.add.remote(k) for k in (1, 2, 3)]))
    ray.kill(counter)

    # Wait (at most 60 s) until the collector's count stops moving for 5 s.
    last, since, deadline = None, time.monotonic(), time.monotonic() + 60
    while time.monotonic() < deadline:
        n = accepted()
        if n != last:
            last, since = n, time.monotonic()
        elif n and time.monotonic() - since >= 5:
            break
        time.sleep(0.5)
    print(f"the collector has accepted {last:.0f} events")


if __name__ == "__main__":
    main()
