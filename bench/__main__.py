import sys

from bench.ringfence_bench import main

sys.exit(main())
