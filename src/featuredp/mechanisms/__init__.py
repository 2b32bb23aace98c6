"""Privacy mechanisms beside the FDP trainer: each module is one mechanism with its own guarantee.

These are not part of Algorithm 1 (:mod:`featuredp.engine`); they are the classic building blocks
and the other systems featuredp compares against or offers next to it:

* :mod:`~featuredp.mechanisms.classic` — randomized response (coin flips, k-ary), the Laplace and
  Gaussian mechanisms (discrete on a grid, exact samplers from :mod:`~featuredp.mechanisms._discrete`),
  the vector mechanism of DP-ERM; numpy only;
* :mod:`~featuredp.mechanisms.labeldp` — label-DP baselines: RR, RR-with-prior, LP-2ST
  (``LabelDPClassifier``);
* :mod:`~featuredp.mechanisms.pate` — PATE: teachers on disjoint, secretly assigned parts, votes
  aggregated by :mod:`featuredp.aggregation`, a student on public inputs;
* :mod:`~featuredp.mechanisms.cloak` — Cloak, inference-time feature suppression with learned
  noise (**no formal guarantee**).

``_labels`` (declared class sets) and ``_ledger`` (reserve-before-fit) are the plumbing of the
sklearn-style private estimators, label-DP's here and :mod:`featuredp.erm`'s, which builds on this
package (never the reverse).

Import from the module (``from featuredp.mechanisms.pate import PATE``): the package itself imports
nothing, so ``featuredp.mechanisms.classic`` stays numpy-only and Cloak's torch is loaded only by
those who use it.
"""
