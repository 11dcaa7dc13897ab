from localrun.entry import main

raise SystemExit(main())
