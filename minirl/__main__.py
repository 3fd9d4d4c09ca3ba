from torch.distributed.elastic.multiprocessing.errors import record

from .cli import main

record(
    main
)()  # under torchrun -m minirl, a failing rank's exception is named in the launcher's summary
