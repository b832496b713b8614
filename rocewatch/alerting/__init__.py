"""Alerting: what happens to the detectors' findings before anyone is told or any node drained.

``group``: one alert per fault (a storm's origin per device, its victims per storm).
``inhibit``: Alertmanager-style inhibit rules; an explained alert is kept but not notified or
drained on. The pipeline runs both in every mode (replay, live, scale-out per fabric domain).
"""

from rocewatch.alerting.group import StormGrouper, views
from rocewatch.alerting.inhibit import INHIBITED_BY, InhibitConfig, Inhibitor, InhibitRule

__all__ = ["INHIBITED_BY", "InhibitConfig", "InhibitRule", "Inhibitor", "StormGrouper", "views"]
