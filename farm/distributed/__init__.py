"""Distributed: the farm on a cluster, through Celery with a Redis (or RabbitMQ) broker.

Takes runs submitted by `farm submit`; gives one Celery worker per device (workers), tasks that
are thin wrappers around the same functions `farm run` calls (tasks, work), delivery rules
(options, coord), run records in the store that `farm status` reads (runs), submit, cancel and
the live workers (control), pool scaling (scale), the queue and run exporter for Prometheus
(exporter) and the task metrics hooked to Celery's signals (instrument). The queue names are
in queues. Celery task names (farm.reference_op, farm.search_chunk) never change, so queued
work survives an upgrade.

May import: every stage below it (farm.search and lower, farm.observe).
"""
