from torch.distributed.elastic.multiprocessing.errors import record

from .apps.cli import main

# under torchrun -m minirl, a failing rank's exception is named in the launcher's summary
record(main)()
