"""jobs"""

import os

# numpy asks the kernel to back every array of 4 MiB or more with transparent huge pages
# (madvise). Under the usual THP defrag setting ("madvise"), the first touch of such an
# array then compacts memory synchronously. A sweep step allocates and frees matrices of
# 100-300 MB (a batch's detection matrix, the matcher's references) on a page cache full
# of features files: on 64 simulated hosts that advice cost ~10 % of a live cycle's CPU, all
# of it system time (docs/fleet.md). Set before numpy is imported here and inherited by the
# spawned workers; an operator's own setting wins.
os.environ.setdefault("NUMPY_MADVISE_HUGEPAGE", "0")
