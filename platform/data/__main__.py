"""``python -m platform.data fetch ...``: see ``platform.data.fetch``."""

from platform.data.fetch import main

raise SystemExit(main())
