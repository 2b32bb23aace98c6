"""Self-tests of the privacy guarantee that users and CI run: the replay harness (:mod:`.replay`).

>>> from featuredp.testing import replay_step
"""

from featuredp.testing.replay import ReplayCheck, ReplayReport, replay_step, replay_votes, verdict

__all__ = ["ReplayCheck", "ReplayReport", "replay_step", "replay_votes", "verdict"]
