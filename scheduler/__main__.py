from scheduler.main import main

raise SystemExit(main())
