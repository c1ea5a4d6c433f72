from linreboot.cli import main

raise SystemExit(main())
