from inspector._internal.cli.main import main

raise SystemExit(main())
