"""Supervision as one level-triggered step: observe the run, decide, act once, record, exit.

A run's truth lives next to its checkpoints (the journal, the lease, the workers' state
objects), never in a process:

* `record`: the journal folded into every timer, budget and counter a decision needs
  (`RunRecord`), pure;
* `seen`: what one step observed of the world (`Seen`): the run's slices in each zone, every
  worker's job, the done marker, the checkpoints;
* `decide`: `decide(seen, record, policy) → Decision`, a pure function, unit-tested with no
  clock and no cloud;
* `world`: reading the world (`observe`) and acting on it (`act`), with a crash point before
  every side effect (`crash`);
* `step`: one step under the run's lease: observe, decide, act, record.

`tpuctl reconcile` runs one step; `tpuctl up` runs steps in a loop with its waits.
"""
