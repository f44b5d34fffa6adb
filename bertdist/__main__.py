from bertdist.cli import main

raise SystemExit(main())
