"""The doctor's instruments, one object each, and the Watch that puts them around a training loop:

  watch.py       Watch: arms the instruments around any loop, drives them by its steps, keeps what they find;
                 and the gradients' instrument (GradientWatch)
  steps.py       the watched steps: each one's end, and each next(batch)'s wait and samples (StepWatch)
  loaders.py     listening to DataLoaders' passes and batches: one patch each, shared by every listener
  forwards.py    forward hooks: input shapes, evaluation forwards, the model tests at the end (ForwardWatch)
  syncs.py       the sync counter: host reads of tensor values (and dropouts that still drop) by source line
  gradients.py   the gradients between two steps and the zero_grad calls that clear them
  evalcheck.py   the tests of a watched model: eval-mode dropout, modules that act differently in train()
  tensors.py     the tensors in an input, an output or a batch, as the instruments read them (tensors_of)

Nothing is imported here: each caller imports the module it needs (`from trainfast.instruments.watch import
Watch`), and the instruments read each other by module, never through this package, so no import goes round.
"""
