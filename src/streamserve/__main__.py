from streamserve.cli.main import main

raise SystemExit(main())
