"""Observe: the farm's Prometheus metrics, the worker's metrics endpoint, container health checks.

Takes events from every stage (a candidate judged, a task run, an object stored); gives
metric families under stable names (metrics), the sum of a worker's processes plus device
readings on one port (worker_metrics), and `python -m farm.observe.health` for container health probes.

Imports no other stage of the farm, so any stage may record a metric without a cycle. What
reads the broker (the exporter) and hooks Celery's signals lives in farm.distributed.
"""
