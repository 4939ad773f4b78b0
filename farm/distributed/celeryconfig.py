"""The Celery app's configuration module (`app.config_from_object("farm.distributed.celeryconfig")`):
its attributes are Celery's settings, computed once from the farm's settings (environment and
config file) by farm.distributed.options."""

from farm.config import load_settings as _load_settings
from farm.distributed.options import values as _values

globals().update(_values(_load_settings()[0]))
