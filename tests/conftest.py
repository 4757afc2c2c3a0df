"""Hypothesis profiles: ``dev`` (quick, default locally) and ``ci`` (thorough; chosen when CI is set).

Select explicitly with HYPOTHESIS_PROFILE=dev|ci.
"""

import os

from hypothesis import HealthCheck, settings

settings.register_profile("dev", max_examples=60, deadline=None)
settings.register_profile(
    "ci", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))
