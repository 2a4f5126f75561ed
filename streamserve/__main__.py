from streamserve.cli import main

raise SystemExit(main())
