from spdrank.cli import main

raise SystemExit(main())
