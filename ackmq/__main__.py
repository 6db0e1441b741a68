from ackmq.cli import main

raise SystemExit(main())
